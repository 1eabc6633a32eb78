// File: shared/tokenizer/internal/jinja_renderer_impl.h
//
// The Renderer behind RenderTemplate (jinja_renderer.h), shared by its two
// source files: jinja_renderer.cc runs statements and expressions,
// jinja_filters.cc the filters, tests and callable functions. Not an API.
#ifndef LEDE_SHARED_TOKENIZER_INTERNAL_JINJA_RENDERER_IMPL_H_
#define LEDE_SHARED_TOKENIZER_INTERNAL_JINJA_RENDERER_IMPL_H_

#include <ctime>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "shared/status/status_macros.h"
#include "shared/tokenizer/internal/jinja_ast.h"
#include "shared/tokenizer/internal/jinja_value.h"

namespace lede::tokenizer::internal {

enum class Flow { kNormal, kBreak, kContinue };

// A filter's arguments: positional `args`, or `kwargs` by name (kwargs win).
struct FilterArgs {
  const std::vector<Value>& args;
  const std::map<std::string, Value>& kwargs;
  const Value* Get(const std::string& key, size_t pos) const {
    auto it = kwargs.find(key);
    if (it != kwargs.end()) return &it->second;
    return pos < args.size() ? &args[pos] : nullptr;
  }
};

// Renders one TemplateProgram: a stack of variable scopes (the first holds the
// globals) over the program. Single-threaded; one per RenderTemplate call.
class Renderer {
 public:
  Renderer(const TemplateProgram& program, std::time_t now);

  std::unordered_map<std::string, Value>& globals() { return scopes_.front(); }

  Status Error(int line, const std::string& what) const;

  StatusOr<Flow> Exec(const Body& body, std::string* out);

  StatusOr<Flow> ExecNode(const Node& n, std::string* out);

  StatusOr<Flow> Assign(const Node& n, Value v);

  StatusOr<List> Iterate(const Value& v, int line);

  Status Bind(const Node& n, const Value& item, std::unordered_map<std::string, Value>* scope);

  StatusOr<Flow> ExecFor(const Node& n, std::string* out);

  Value Lookup(const std::string& name) const;

  static bool IsStringMethod(const std::string& n);

  // obj.name: a dict key or namespace attribute, a method, or Undefined.
  StatusOr<Value> GetAttr(const Value& obj, const std::string& name, int line);

  StatusOr<Value> GetItem(const Value& obj, const Value& key, int line);

  StatusOr<Value> Slice(const Value& obj, const Value* start, const Value* stop, const Value* step, int line);

  StatusOr<Value> Arith(const std::string& op, const Value& a, const Value& b, int line);

  StatusOr<bool> Compare(const std::string& op, const Value& a, const Value& b, int line);

  StatusOr<bool> ApplyTest(const std::string& name, const Value& v, const std::vector<Value>& args, int line);

  // selectattr / rejectattr / map over an iterable.
  StatusOr<Value> AttrFilter(const std::string& name, const Value& seq, const std::vector<Value>& args,
                             const std::map<std::string, Value>& kwargs, int line);

  // String filters: trim, string, upper, lower, capitalize, title, replace; nullopt when `name` is not one of them.
  std::optional<StatusOr<Value>> StringFilter(const std::string& name, const Value& v, const FilterArgs& fa,
                                                    int line);

  // Sequence filters: length/count, list, first, last, reverse, unique, join, items; nullopt when `name` is not one of them.
  std::optional<StatusOr<Value>> SequenceFilter(const std::string& name, const Value& v, const FilterArgs& fa,
                                                    int line);

  // Number filters: int, float, abs; nullopt when `name` is not one of them.
  std::optional<StatusOr<Value>> NumberFilter(const std::string& name, const Value& v, const FilterArgs& fa,
                                                    int line);

  StatusOr<Value> ApplyFilter(const std::string& name, const Value& v, const std::vector<Value>& args,
                              const std::map<std::string, Value>& kwargs, int line);

  StatusOr<Value> CallFunction(const Value& f, const std::vector<Value>& args,
                               const std::map<std::string, Value>& kwargs, int line);

  Status EvalArgs(const Expr& e, size_t first, std::vector<Value>* args, std::map<std::string, Value>* kwargs);

  StatusOr<Value> Eval(const Expr& e);

  // Eval of a call, filter or test expression (`f(x)`, `x | f`, `x is t`).
  StatusOr<Value> EvalCall(const Expr& e);

  // Eval of a string concatenation (`a ~ b`), list or dict literal.
  StatusOr<Value> EvalCollection(const Expr& e);

 private:
  const TemplateProgram& program_;
  std::time_t now_;
  std::vector<std::unordered_map<std::string, Value>> scopes_;
};

}  // namespace lede::tokenizer::internal

#endif  // LEDE_SHARED_TOKENIZER_INTERNAL_JINJA_RENDERER_IMPL_H_
