#include "base/terminate_handler.h"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>

namespace hyperion {
namespace {

[[noreturn]] void on_terminate() {
  if (const std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::bad_alloc&) {
      std::fputs(kOutOfMemoryMessage, stderr);
      std::fflush(stderr);
      std::_Exit(1);  // no destructors: other threads may still hold what they allocated
    } catch (const std::exception& x) {
      std::fprintf(stderr, "hyperion: internal error: uncaught exception: %s\n", x.what());
    } catch (...) {
      std::fputs("hyperion: internal error: uncaught exception of unknown type\n", stderr);
    }
  } else {
    std::fputs("hyperion: internal error: std::terminate called\n", stderr);
  }
  std::fflush(stderr);
  std::abort();
}

}  // namespace

void install_terminate_handler() {
  std::set_terminate(on_terminate);
}

}  // namespace hyperion
