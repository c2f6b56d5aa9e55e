/* test_device.h — for tests that can run on another device (HEARTH_TEST_DEVICE,
 * see test.h): when that device cannot be opened here, the test exits 77,
 * which ctest reports as skipped, after saying why. */
#ifndef HEARTH_TEST_DEVICE_H
#define HEARTH_TEST_DEVICE_H

#include <stdio.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "test.h"

static inline void test_device_or_skip(void) {
  const char *d = test_device();
  if (!d) return;
  bk_backend *be = NULL;
  herr e = {0};
  if (bk_backend_open(d, NULL, &be, &e)) {
    printf("SKIPPED: device %s is not usable here: %s\n", d, e.msg);
    fprintf(stderr, "SKIPPED: device %s is not usable here: %s\n", d, e.msg);
    exit(77);
  }
  bk_backend_close(be);
}

#endif
