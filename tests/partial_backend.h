/* partial_backend.h — a backend that starts partial, for the tests of
 * backend.h's partial backends: a CPU backend whose table is a copy of the
 * CPU's (in *table, which must outlive it) with the entries strip() takes
 * out, named "partial". */
#ifndef HEARTH_TESTS_PARTIAL_BACKEND_H
#define HEARTH_TESTS_PARTIAL_BACKEND_H

#include <stdio.h>

#include "backend/backend.h"

static inline bk_backend *open_partial_cpu(bk_backend_ops *table, void (*strip)(bk_backend_ops *)) {
  bk_backend *be = NULL;
  herr err = {0};
  if (bk_cpu_open(&(bk_open_opts){.threads = 2}, &be, &err)) return NULL;
  *table = *be->ops;
  strip(table);
  be->ops = table;
  snprintf(be->name, sizeof be->name, "partial");
  return be;
}

#endif
