/* logs.h — conversation logs read into turns (who spoke, what was said).
 *
 * Formats, told by the content (the extension only breaks ties):
 *   - OpenAI-style chat JSONL: each line a message {"role", "content"} or a
 *     conversation {"messages": [...]}; content a string or parts
 *     [{"type": "text", "text"}] (other parts are left out);
 *   - Anthropic-style JSON: {"system", "messages": [...]} with content a
 *     string or blocks ({"type": "text"}; tool_use / tool_result blocks give
 *     their text or input as JSON), or a bare array of messages;
 *   - Markdown or plain-text transcripts: a line that starts with a speaker
 *     ("User:", "**Assistant:**", "## Human", "> Claude:") opens a turn, the
 *     lines after it belong to it; a transcript with no speaker lines is
 *     taken a paragraph a turn (role "text").
 * Text that is not valid UTF-8 has its stray bytes replaced by U+FFFD.
 */
#ifndef HEARTH_MEMORY_LOGS_H
#define HEARTH_MEMORY_LOGS_H

#include <stddef.h>

#include "base/status.h"

typedef struct mem_turn {
  char *role;   /* owned: "user", "assistant", "system", "tool", "text", or a transcript's speaker lowercased */
  char *text;   /* owned, trimmed */
} mem_turn;

typedef struct mem_log {
  char *name;       /* owned: the file's base name (what sources cite) */
  char hash[17];    /* the content's hash (state.h mem_hash_hex) */
  mem_turn *turns;  /* owned */
  size_t n_turns;
} mem_log;

/* Reads path into *out (zeroed first). HEARTH_EFORMAT naming the file and
 * line for JSON that does not parse; a log with no text is an empty log. */
int mem_log_read(const char *path, mem_log *out, herr *err);
/* The same from bytes (name: what the log is called). */
int mem_log_parse(const char *name, const char *data, size_t len, mem_log *out, herr *err);
void mem_log_free(mem_log *l);

#endif
