// File: shared/flags/flags.h
//
// FlagSet: "--name value", "--name=value" and boolean "--name" (or
// "--name=true|false") flags for every LEDE binary, parsed by CLI11 (Debian
// libcli11-dev, header-only, so the engine-only build can use it too; CLI11
// stays out of this header). The wrapper keeps the mains short and the
// behaviour users see the same: the last occurrence of a flag wins (so the
// command line overrides --config), --help is the caller's (WantsHelp,
// Usage), and every error is one line naming the flag.
//
// Example:
//   int64_t n = 64; std::string model;
//   FlagSet flags;
//   flags.Add("model", &model, "checkpoint directory or .bin", /*required=*/true);
//   flags.Add("max-new-tokens", &n, "tokens to generate");
//   if (Status s = flags.Parse(args); !s.ok()) { ...exit 2... }
#ifndef LEDE_SHARED_FLAGS_FLAGS_H_
#define LEDE_SHARED_FLAGS_FLAGS_H_

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "shared/status/status.h"

namespace lede::flags {

class FlagSet {
 public:
  using Target = std::variant<std::string*, int64_t*, double*, bool*>;

  void Add(const std::string& name, Target target, const std::string& help,
           bool required = false);

  // Parses `args` (without the program and subcommand names) into the
  // targets. Errors: kInvalidArgument with a one-line message naming the flag
  // for an unknown flag ("unknown flag --name"), a missing value, a value of
  // the wrong type, a missing required flag ("--name is required"), or a
  // positional argument ("unexpected argument 'x'"). Targets of flags parsed
  // before the error may have been assigned.
  Status Parse(const std::vector<std::string>& args);

  // One line per flag: "  --name  help (default: value)".
  std::string Usage() const;

 private:
  struct Flag {
    std::string name;
    Target target;
    std::string help;
    bool required;
  };
  std::vector<Flag> flags_;
};

// A process's flags from a config file plus the command line: when `args`
// holds "--config FILE" (or --config=FILE), FILE's lines come first and the
// rest of `args` after them, so the command line wins. FILE holds one flag
// per line, "name = value" (or "name: value", or a bare "name" for a true
// boolean); '#' starts a comment; blank lines are skipped.
// Errors: kNotFound / kInvalidArgument naming the file and line.
StatusOr<std::vector<std::string>> ExpandConfigFile(const std::vector<std::string>& args);

// True if `args` asks for help (--help or -h).
bool WantsHelp(const std::vector<std::string>& args);

// The items of a comma-separated list flag ("a,b,,c" -> a, b, c).
std::vector<std::string> SplitList(const std::string& text);

// A comma-separated list of integers. Errors: kInvalidArgument naming
// `flag` and the bad item.
StatusOr<std::vector<int32_t>> ParseIntList(const std::string& flag, const std::string& text);

}  // namespace lede::flags

#endif  // LEDE_SHARED_FLAGS_FLAGS_H_
