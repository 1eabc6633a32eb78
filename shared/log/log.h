// File: shared/log/log.h
//
// LEDE's one logger: logfmt lines on stderr, one per event, that every
// process writes (the servers' lifecycle, sessions, policy reloads, ...).
// shared/rpc/server.h forwards rpc::LogEvent and rpc::SetLogProcessName here.
// Torch-free; Abseil synchronization only.
//
// Example:
//   log::SetLogProcessName("verifier");
//   log::LogEvent("warn", "session_reclaimed", {{"slot", "3"}});
//   // ts=2026-12-04T06:00:00.000Z level=warn proc=verifier event=session_reclaimed slot=3
#ifndef LEDE_SHARED_LOG_LOG_H_
#define LEDE_SHARED_LOG_LOG_H_

#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

namespace lede::log {

// One logfmt line on stderr: `ts=<RFC 3339 UTC> level=<level> proc=<process>
// event=<event> key=value ...`, values quoted when they contain spaces,
// quotes or '='. Thread-safe (one write per line).
void LogEvent(std::string_view level, std::string_view event,
              std::initializer_list<std::pair<std::string_view, std::string>> fields = {});

// The process name LogEvent writes (set by rpc::ServerRunner; "lede" by
// default). Thread-safe.
void SetLogProcessName(std::string name);

}  // namespace lede::log

#endif  // LEDE_SHARED_LOG_LOG_H_
