/* page.c — the chat page served at GET /: one self-contained HTML document
 * (markup, style, script, icon, libraries; nothing fetched from elsewhere).
 * Its sources are src/serve/page/ (chat.html, chat.css, chat.js); the build
 * (cmake/embed_page.cmake) joins them with the Markdown, sanitizer,
 * highlighting and math libraries tools/fetch_page_deps.sh fetched, into
 * serve_page.h. */
#include "serve/server.h"

#include "serve_page.h"

const char *const serve_page_html = serve_page_bytes;
const size_t serve_page_html_len = sizeof serve_page_bytes - 1;
