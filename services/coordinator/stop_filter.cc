#include "services/coordinator/stop_filter.h"

#include <algorithm>
#include <utility>

namespace lede::coordinator {

StopStringFilter::StopStringFilter(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (const std::string& s : stops_) max_stop_ = std::max(max_stop_, s.size());
}

std::string StopStringFilter::Push(const std::string& text) {
  if (stopped_) return "";
  held_ += text;
  size_t first = std::string::npos;
  for (const std::string& stop : stops_) first = std::min(first, held_.find(stop));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Hold back what could still become a stop string, cut at a character boundary.
  const size_t keep = max_stop_ > 0 ? std::min(held_.size(), max_stop_ - 1) : 0;
  size_t cut = held_.size() - keep;
  while (cut > 0 && cut < held_.size() && (static_cast<unsigned char>(held_[cut]) & 0xC0) == 0x80) --cut;
  std::string out = held_.substr(0, cut);
  held_.erase(0, cut);
  return out;
}

std::string StopStringFilter::Flush() {
  std::string out = std::move(held_);
  held_.clear();
  return out;
}

}  // namespace lede::coordinator
