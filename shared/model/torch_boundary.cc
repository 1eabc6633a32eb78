#include "shared/model/torch_boundary.h"

#include <exception>
#include <new>
#include <string>

#include <c10/util/Exception.h>

namespace lede::model {

Status StatusFromCurrentException(std::string_view what) {
  const std::string prefix = what.empty() ? std::string() : std::string(what) + ": ";
  try {
    throw;
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError(prefix + "out of memory");
  } catch (const c10::OutOfMemoryError& e) {
    return ResourceExhaustedError(prefix + e.what_without_backtrace());
  } catch (const c10::Error& e) {
    return InternalError(prefix + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return InternalError(prefix + e.what());
  } catch (...) {
    return InternalError(prefix + "unknown exception");
  }
}

}  // namespace lede::model
