// File: services/coordinator/stop_filter.h
//
// Stop strings over a token stream (the OpenAI API's `stop`, vLLM's
// stop-string handling): generated text is held back while it could still
// be the start of a stop string, and cut before the first stop string that
// appears. Works on decoded UTF-8 text (a StreamingDetokenizer's output);
// never splits a character. Not thread-safe: one filter per request.
#ifndef LEDE_SERVICES_COORDINATOR_STOP_FILTER_H_
#define LEDE_SERVICES_COORDINATOR_STOP_FILTER_H_

#include <cstddef>
#include <string>
#include <vector>

namespace lede::coordinator {

class StopStringFilter {
 public:
  // `stops`: non-empty UTF-8 strings (the caller validates them); none means
  // every Push() returns its text at once.
  explicit StopStringFilter(std::vector<std::string> stops);

  // Appends `text` (decoded output) and returns what may be sent now: all
  // but the last (longest stop - 1) bytes, cut back to a character boundary.
  // When a stop string appears, returns the text before the earliest one
  // (over all stops), and stopped() becomes true; the rest is dropped and
  // later calls return "".
  std::string Push(const std::string& text);

  // True once a stop string matched.
  bool stopped() const { return stopped_; }

  // At the end of the stream: the held-back text ("" after a stop).
  std::string Flush();

 private:
  std::vector<std::string> stops_;
  size_t max_stop_ = 0;  // bytes of the longest stop string
  std::string held_;     // not yet sent
  bool stopped_ = false;
};

}  // namespace lede::coordinator

#endif  // LEDE_SERVICES_COORDINATOR_STOP_FILTER_H_
