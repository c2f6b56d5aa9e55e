/* ls.c — `hearth ls`: the models hearth can name — those in the Hugging Face
 * cache (by Hub id and revision) and those in hearth's registry (hearth scan) —
 * with format, size, architecture and whether hearth runs them, and why not
 * (read by inspect.c from the files' headers, nothing loaded). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/file.h"
#include "cli/cli.h"
#include "hub/hub.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: hearth ls [--json]\n\n"
          "Lists the models of the Hugging Face cache (NAME is the Hub id, with\n"
          "@REVISION when not main) and of hearth's registry (hearth scan), with the\n"
          "commit, the format (safetensors or gguf), the size on disk, the architecture\n"
          "and whether hearth can run it (and if not, why).\n\n"
          "  --json   one JSON array of {name, source, path, revision, format, bytes,\n"
          "           architecture, runnable, problem}\n");
}

static void human(char *out, size_t cap, double v) {
  static const char *u[] = {"B", "kB", "MB", "GB", "TB"};
  int k = 0;
  while (v >= 1000 && k < 4) v /= 1000, k++;
  snprintf(out, cap, k ? "%.1f %s" : "%.0f %s", v, u[k]);
}

/* quantization_level as Ollama shows it: a quantized format's method and bits, else the
 * dtype that holds most of the bytes ("BF16", "Q4_K"). */
static json_t *quant_level(const json_t *facts) {
  json_t *q = json_object_get(facts, "quantization");
  if (json_is_object(q)) {
    const char *m = json_string_value(json_object_get(q, "method"));
    json_t *bits = json_object_get(q, "bits");
    if (m && json_is_integer(bits)) return json_sprintf("%s %d-bit", m, (int)json_integer_value(bits));
    if (m) return json_string(m);
  }
  const char *best = NULL, *k;
  json_int_t most = -1;
  json_t *v;
  json_object_foreach(json_object_get(facts, "bytes_by_dtype"), k, v) if (json_integer_value(v) > most) {
    most = json_integer_value(v);
    best = k;
  }
  if (!best) return json_null();
  char up[64];
  size_t i = 0;
  for (; best[i] && i < sizeof up - 1; i++) up[i] = (char)(best[i] >= 'a' && best[i] <= 'z' ? best[i] - 32 : best[i]);
  up[i] = 0;
  return json_string(up);
}

static void add_entry(json_t *list, const char *name, const char *source, const char *path, const char *commit) {
  json_t *o = json_object();
  char problem[1024] = "";
  json_t *facts = path ? cli_inspect_json(path, problem, sizeof problem) : NULL;
  const char *fmt = json_string_value(json_object_get(facts, "format"));
  const char *arch = json_string_value(json_object_get(facts, "model_type"));
  bool runs = facts && !problem[0] && json_is_true(json_object_get(facts, "supported"));
  if (!path) snprintf(problem, sizeof problem, "no model in the snapshot (no config.json, no GGUF file)");
  else if (!facts && !problem[0]) snprintf(problem, sizeof problem, "the weights could not be read");
  json_object_set_new(o, "name", json_string(name));
  json_object_set_new(o, "source", json_string(source));
  json_object_set_new(o, "path", path ? json_string(path) : json_null());
  json_object_set_new(o, "revision", commit ? json_string(commit) : json_null());
  json_object_set_new(o, "format", fmt ? json_string(fmt) : json_null());
  json_object_set_new(o, "bytes", json_integer(path ? hub_tree_bytes(path) : 0));
  json_object_set_new(o, "architecture", arch ? json_string(arch) : json_null());
  json_object_set_new(o, "runnable", json_boolean(runs));
  json_object_set_new(o, "problem", problem[0] ? json_string(problem) : json_null());
  json_object_set_new(o, "parameters", json_integer(json_integer_value(json_object_get(facts, "parameters"))));
  json_object_set_new(o, "quantization", quant_level(facts));
  struct stat st;
  json_object_set_new(o, "modified", json_integer(path && !stat(path, &st) ? (json_int_t)st.st_mtime : 0));
  json_array_append_new(list, o);
  json_decref(facts);
}

/* refs under dir (refs/main, refs/pr/1) as revision names, each with its snapshot. */
static void walk_refs(json_t *list, const char *repo_id, const char *repo_dir, const char *dir, const char *prefix,
                      json_t *seen) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char rev[512], *p = hpath_join(dir, e->d_name);
    snprintf(rev, sizeof rev, "%s%s", prefix, e->d_name);
    if (p && hfile_is_dir(p)) {
      char sub[520];
      snprintf(sub, sizeof sub, "%s/", rev);
      walk_refs(list, repo_id, repo_dir, p, sub, seen);
    } else if (p) {
      char *commit = NULL, *model = NULL;
      if (!hub_cache_commit(repo_dir, rev, &commit, NULL)) {
        char snap[4200], name[800];
        snprintf(snap, sizeof snap, "%s/snapshots/%s", repo_dir, commit);
        if (hfile_is_dir(snap)) {
          hub_snapshot_model(snap, NULL, &model, NULL);
          snprintf(name, sizeof name, "%s%s%s", repo_id, strcmp(rev, "main") ? "@" : "", strcmp(rev, "main") ? rev : "");
          add_entry(list, name, "hf-cache", model, commit);
          json_object_set_new(seen, commit, json_true());
        }
      }
      free(commit);
      free(model);
    }
    free(p);
  }
  closedir(d);
}

static void list_cache(json_t *list) {
  char *root = hub_cache_root();
  DIR *d = root ? opendir(root) : NULL;
  struct dirent *e;
  while (d && (e = readdir(d))) {
    char id[600];
    if (!hub_repo_from_dir(e->d_name, id, sizeof id)) continue;
    char *repo = hpath_join(root, e->d_name), *refs = repo ? hpath_join(repo, "refs") : NULL,
         *snaps = repo ? hpath_join(repo, "snapshots") : NULL;
    json_t *seen = json_object();
    if (refs) walk_refs(list, id, repo, refs, "", seen);
    DIR *s = snaps ? opendir(snaps) : NULL;
    struct dirent *c;
    while (s && (c = readdir(s))) { /* snapshots no ref names: by commit */
      if (c->d_name[0] == '.' || json_object_get(seen, c->d_name)) continue;
      char snap[4200], name[800], *model = NULL;
      snprintf(snap, sizeof snap, "%s/%s", snaps, c->d_name);
      snprintf(name, sizeof name, "%s@%s", id, c->d_name);
      hub_snapshot_model(snap, NULL, &model, NULL);
      add_entry(list, name, "hf-cache", model, c->d_name);
      free(model);
    }
    if (s) closedir(s);
    json_decref(seen);
    free(repo);
    free(refs);
    free(snaps);
  }
  if (d) closedir(d);
  free(root);
}

json_t *cli_model_facts(const char *name, const char *path) {
  json_t *list = json_array();
  add_entry(list, name, "served", path, NULL);
  json_t *o = json_incref(json_array_get(list, 0));
  json_decref(list);
  return o;
}

json_t *cli_model_list(void) {
  json_t *list = json_array(), *reg = NULL;
  list_cache(list);
  herr err = {0};
  if (hub_registry_load(&reg, &err)) fprintf(stderr, "hearth: %s\n", err.msg);
  const char *key;
  json_t *v;
  json_object_foreach(reg, key, v) {
    const char *p = json_string_value(json_object_get(v, "path"));
    add_entry(list, key, "registry", p && hfile_exists(p) ? p : NULL, NULL);
    if (p && !hfile_exists(p))
      json_object_set_new(json_array_get(list, json_array_size(list) - 1), "problem",
                          json_sprintf("%s is gone (hearth rm %s forgets it)", p, key));
  }
  json_decref(reg);
  return list;
}

int cli_ls(int argc, char **argv) {
  bool as_json = false;
  for (int i = 1; i < argc; i++) {
    if (cli_is_help(argv[i])) {
      usage(stdout);
      return 0;
    } else if (!strcmp(argv[i], "--json")) as_json = true;
    else return cli_usage_error("ls", "unknown argument '%s'", argv[i]);
  }
  json_t *list = cli_model_list(), *v;
  if (as_json) {
    char *text = json_dumps(list, JSON_INDENT(2));
    printf("%s\n", text ? text : "[]");
    free(text);
  } else {
    printf("%-40s %-12s %-11s %9s  %-16s %s\n", "NAME", "REVISION", "FORMAT", "SIZE", "ARCHITECTURE", "RUNS");
    size_t i;
    json_array_foreach(list, i, v) {
      char size[32];
      human(size, sizeof size, (double)json_integer_value(json_object_get(v, "bytes")));
      const char *rev = json_string_value(json_object_get(v, "revision"));
      const char *fmt = json_string_value(json_object_get(v, "format"));
      const char *arch = json_string_value(json_object_get(v, "architecture"));
      const char *problem = json_string_value(json_object_get(v, "problem"));
      printf("%-40s %-12.12s %-11s %9s  %-16s %s%s\n", json_string_value(json_object_get(v, "name")), rev ? rev : "-",
             fmt ? fmt : "-", size, arch ? arch : "-", json_is_true(json_object_get(v, "runnable")) ? "yes" : "no: ",
             json_is_true(json_object_get(v, "runnable")) ? "" : problem ? problem : "unknown");
    }
    if (!json_array_size(list)) printf("(none: hearth get ORG/NAME fetches one, hearth scan DIR finds them)\n");
  }
  json_decref(list);
  return 0;
}
