/* stub.c: rt_cpu_backend when flexc is built without LLVM (llvm-14-dev or
 * llvm-15-dev absent at configure time): every call is refused with a
 * message that says what to install. */
#include "cpu/cpu.h"
#include "runtime/backend.h"

static flex_status why(void) {
  return rt_err(FLEX_ERR_UNSUPPORTED,
                "the cpu backend is not in this build of flexc: it needs LLVM's C API (install "
                "llvm-15-dev or llvm-14-dev, e.g. with scripts/setup.sh, and reconfigure)");
}

static flex_status stub_open(RtRun *r) {
  (void)r;
  return why();
}

bool rt_cpu_available(void) { return why() == FLEX_OK; }

const RtBackend rt_cpu_backend = {.name = "cpu", .host_memory = true, .open = stub_open};
