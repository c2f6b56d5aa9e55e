/* scan.c — `hearth scan DIR...`: finds model folders (config.json beside
 * safetensors) and GGUF files under each DIR and adds them to hearth's
 * registry by reference (hub/registry.c), so that `--model NAME` finds them.
 * Owns the walk; the registry file is hub/'s. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/file.h"
#include "cli/cli.h"
#include "hub/hub.h"

#define SCAN_MAX_DEPTH 6

static void usage(FILE *f) {
  fprintf(f,
          "usage: hearth scan DIR...\n\n"
          "Adds the models found under each DIR — folders with a config.json and\n"
          "safetensors weights, and .gguf files (a split GGUF by its first part) — to\n"
          "hearth's registry, by reference: nothing is copied or moved. Each gets a name\n"
          "from its folder or file name (hearth ls lists them; --model NAME uses them).\n"
          "The registry is $HEARTH_HOME/registry.json, else\n"
          "${XDG_DATA_HOME:-~/.local/share}/hearth/registry.json. The Hugging Face cache\n"
          "is not scanned: its models are found by their Hub ids.\n");
}

static bool ends_with(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && !strcmp(s + a - b, suf);
}

static bool is_model_folder(const char *dir) {
  char *cfg = hpath_join(dir, "config.json");
  bool ok = cfg && hfile_exists(cfg);
  free(cfg);
  if (!ok) return false;
  DIR *d = opendir(dir);
  if (!d) return false;
  struct dirent *e;
  bool st = false;
  while (!st && (e = readdir(d))) st = ends_with(e->d_name, ".safetensors");
  closedir(d);
  return st;
}

static int add(void *ctx, const char *path) {
  int *count = ctx;
  herr err = {0};
  char *name = NULL;
  if (hub_registry_add(path, &name, &err)) return cli_fail("%s", err.msg);
  printf("%-32s %s\n", name, path);
  free(name);
  (*count)++;
  return 0;
}

static int walk(const char *dir, int depth, int (*fn)(void *ctx, const char *path), void *ctx) {
  if (is_model_folder(dir)) return fn(ctx, dir);
  if (depth > SCAN_MAX_DEPTH) return 0;
  DIR *d = opendir(dir);
  if (!d) return 0;
  struct dirent *e;
  int rc = 0;
  while (!rc && (e = readdir(d))) {
    if (e->d_name[0] == '.' || !strncmp(e->d_name, "models--", 8)) continue;
    char *p = hpath_join(dir, e->d_name);
    struct stat st;
    if (p && !stat(p, &st)) {
      if (S_ISDIR(st.st_mode)) rc = walk(p, depth + 1, fn, ctx);
      else if (S_ISREG(st.st_mode) && ends_with(e->d_name, ".gguf") && strncasecmp(e->d_name, "mmproj", 6) &&
               !hub_gguf_is_later_shard(e->d_name))
        rc = fn(ctx, p);
    }
    free(p);
  }
  closedir(d);
  return rc;
}

int cli_find_models(const char *dir, int (*fn)(void *ctx, const char *path), void *ctx) {
  return walk(dir, 0, fn, ctx);
}

int cli_scan(int argc, char **argv) {
  int n = 0, count = 0;
  for (int i = 1; i < argc; i++) {
    if (cli_is_help(argv[i])) {
      usage(stdout);
      return 0;
    }
    if (argv[i][0] == '-' && argv[i][1]) return cli_usage_error("scan", "unknown option '%s'", argv[i]);
    n++;
  }
  if (!n) return cli_usage_error("scan", "which folders? e.g. hearth scan ~/models");
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st)) return cli_fail("%s: no such folder or file", argv[i]);
    int rc = S_ISDIR(st.st_mode) ? walk(argv[i], 0, add, &count) : add(&count, argv[i]);
    if (rc) return rc;
  }
  char *rp = hub_registry_path();
  fprintf(stderr, "hearth: %d model%s found, registered in %s\n", count, count == 1 ? "" : "s", rp ? rp : "");
  free(rp);
  return 0;
}
