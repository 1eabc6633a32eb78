#include "shared/flags/flags.h"

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <CLI/CLI.hpp>

namespace lede::flags {

void FlagSet::Add(const std::string& name, Target target, const std::string& help,
                  bool required) {
  flags_.push_back(Flag{name, target, help, required});
}

namespace {

// The first line of a CLI11 message (they are one line today; be sure).
std::string FirstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

}  // namespace

Status FlagSet::Parse(const std::vector<std::string>& args) {
  CLI::App app;
  app.set_help_flag();            // --help is the caller's (WantsHelp, Usage)
  app.allow_extras();             // reported below, in our words
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  for (const Flag& f : flags_) {
    const std::string name = "--" + f.name;
    if (auto* s = std::get_if<std::string*>(&f.target)) {
      app.add_option(name, **s, f.help);
    } else if (auto* i = std::get_if<int64_t*>(&f.target)) {
      app.add_option(name, **i, f.help);
    } else if (auto* d = std::get_if<double*>(&f.target)) {
      app.add_option(name, **d, f.help);
    } else if (auto* b = std::get_if<bool*>(&f.target)) {
      app.add_flag(name, **b, f.help);
    }
  }
  try {
    std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them last-first
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    return InvalidArgumentError(FirstLine(e.what()));
  }
  const std::vector<std::string> extras = app.remaining();
  if (!extras.empty()) {
    const std::string& arg = extras.front();
    if (arg.rfind("--", 0) == 0 && arg.size() > 2) {
      return InvalidArgumentError("unknown flag " + arg.substr(0, arg.find('=')));
    }
    return InvalidArgumentError("unexpected argument '" + arg + "'");
  }
  // Required flags are checked here, after unknown ones, so a typo is
  // reported as such rather than as the flag it failed to set.
  for (const Flag& f : flags_) {
    if (f.required && app.count("--" + f.name) == 0) return InvalidArgumentError("--" + f.name + " is required");
  }
  return OkStatus();
}

std::string FlagSet::Usage() const {
  std::ostringstream out;
  for (const Flag& f : flags_) {
    out << "  --" << f.name << "  " << f.help;
    if (f.required) {
      out << " (required)";
    } else if (auto* s = std::get_if<std::string*>(&f.target)) {
      if (!(*s)->empty()) out << " (default: " << **s << ")";
    } else if (auto* i = std::get_if<int64_t*>(&f.target)) {
      out << " (default: " << **i << ")";
    } else if (auto* d = std::get_if<double*>(&f.target)) {
      out << " (default: " << **d << ")";
    }
    out << "\n";
  }
  return out.str();
}

bool WantsHelp(const std::vector<std::string>& args) {
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h") return true;
  }
  return false;
}

std::vector<std::string> SplitList(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

StatusOr<std::vector<int32_t>> ParseIntList(const std::string& flag, const std::string& text) {
  std::vector<int32_t> values;
  for (const std::string& item : SplitList(text)) {
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (*end != '\0' || errno != 0 || v < INT32_MIN || v > INT32_MAX) {
      return InvalidArgumentError("--" + flag + ": '" + item + "' is not an integer");
    }
    values.push_back(static_cast<int32_t>(v));
  }
  return values;
}

StatusOr<std::vector<std::string>> ExpandConfigFile(const std::vector<std::string>& args) {
  std::vector<std::string> rest, from_file;
  std::string path;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--config") {
      if (i + 1 >= args.size()) return InvalidArgumentError("--config: missing value");
      path = args[++i];
    } else if (args[i].rfind("--config=", 0) == 0) {
      path = args[i].substr(9);
    } else {
      rest.push_back(args[i]);
    }
  }
  if (path.empty()) return rest;
  std::ifstream in(path);
  if (!in) return NotFoundError("--config: cannot read " + path);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    auto trim = [](std::string t) {
      const char* ws = " \t\r";
      t.erase(0, t.find_first_not_of(ws));
      t.erase(t.find_last_not_of(ws) + 1);
      return t;
    };
    line = trim(line);
    if (line.empty()) continue;
    size_t sep = line.find_first_of("=:");
    std::string name = trim(line.substr(0, sep));
    if (name.rfind("--", 0) == 0) name = name.substr(2);
    if (name.empty() || name.find(' ') != std::string::npos) {
      return InvalidArgumentError("--config: " + path + ":" + std::to_string(n) +
                                  ": expected 'name = value'");
    }
    if (sep == std::string::npos) {
      from_file.push_back("--" + name);
    } else {
      from_file.push_back("--" + name + "=" + trim(line.substr(sep + 1)));
    }
  }
  from_file.insert(from_file.end(), rest.begin(), rest.end());
  return from_file;
}

}  // namespace lede::flags
