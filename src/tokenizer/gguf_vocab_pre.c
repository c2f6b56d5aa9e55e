/* gguf_vocab_pre.c — the pre-tokenizer of every tokenizer.ggml.pre value
 * llama.cpp knows for BPE vocabularies: its list of regexes (written exactly
 * as llama.cpp writes them, since the splitter recognises some by their text)
 * and the flags that come with it (space clean-up on decode, whole-word
 * lookup before merges, BOS/SEP defaults). Refuses to know how the regexes
 * run (gguf_vocab_split.c) or how tokens are merged (gguf_vocab.c).
 * Values llama.cpp handles with code of its own (kimi-k2, afmoe,
 * whitespace, hybriddna) are not listed and load as unsupported.
 */
#include <string.h>

#include "tokenizer/gguf_vocab_internal.h"


#define RX_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RX_LLAMA3                                                                                                   \
  "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|" \
  "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RX_QWEN2                                                                                                     \
  "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|" \
  "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RX_CJK "[\xe4\xb8\x80-\xe9\xbe\xa5\xe0\xa0\x80-\xe4\xb8\x80\xea\xb0\x80-\xed\x9f\xbf]+" /* [一-龥ࠀ-一가-퟿]+ */
#define RX_PORO " ?[^(\\s|.,!?\xe2\x80\xa6\xe3\x80\x82\xef\xbc\x8c\xe3\x80\x81\xe0\xa5\xa4\xdb\x94\xd8\x8c)]+"
#define RX_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RX_UPPER_LOWER                                                                                          \
  "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+" RX_CONTRACTIONS                       \
  "?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*" RX_CONTRACTIONS                     \
  "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RX_DS3_PUNCT_WORDS                                                                                      \
  "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|" \
  "\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
#define RX_HAN_KANA "[\xe4\xb8\x80-\xe9\xbe\xa5\xe3\x81\x80-\xe3\x82\x9f\xe3\x82\xa0-\xe3\x83\xbf]+" /* [一-龥぀-ゟ゠-ヿ]+ */

static const char *const PRE_DEFAULT[] = {"[\\p{P}\\$\\+<=>\\^~\\|]+", RX_GPT2, "\\p{N}+", "[0-9][0-9][0-9]", NULL};
static const char *const PRE_LLAMA3[] = {RX_LLAMA3, NULL};
static const char *const PRE_JAIS2[] = {
    RX_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s{512}(?!\\S)|"
                    "\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|"
                    "\\s{1,2}(?!\\S)|\\s{1}",
    NULL};
static const char *const PRE_DEEPSEEK_LLM[] = {
    "[\r\n]",
    "\\s?[A-Za-z\xc2\xb5\xc3\x80-\xc3\x96\xc3\x98-\xc3\xb6\xc3\xb8-\xc6\xba\xc6\xbc-\xc6\xbf\xc7\x84-\xca\x93\xca\x95-\xca\xaf"
    "\xcd\xb0-\xcd\xb3\xcd\xb6\xcd\xb7\xcd\xbb-\xcd\xbd\xcd\xbf\xce\x86\xce\x88-\xce\x8a\xce\x8c\xce\x8e-\xce\xa1\xce\xa3-\xcf\xb5"
    "\xcf\xb7-\xd2\x81\xd2\x8a-\xd4\xaf\xd4\xb1-\xd5\x96\xe1\x82\xa0-\xe1\x83\x85\xe1\x8e\xa0-\xe1\x8f\xb5\xe1\x8f\xb8-\xe1\x8f\xbd"
    "\xe1\xb2\x90-\xe1\xb2\xba\xe1\xb2\xbd-\xe1\xb2\xbf\xe1\xb4\x80-\xe1\xb4\xab\xe1\xb5\xab-\xe1\xb5\xb7\xe1\xb5\xb9-\xe1\xb6\x9a"
    "\xe1\xb8\x80-\xe1\xbc\x95\xe1\xbc\x98-\xe1\xbc\x9d\xe1\xbc\xa0-\xe1\xbd\x85\xe1\xbd\x88-\xe1\xbd\x8d\xe1\xbd\x90-\xe1\xbd\x97"
    "\xe1\xbd\x99\xe1\xbd\x9b\xe1\xbd\x9d\xe1\xbd\x9f-\xe1\xbd\xbd\xe1\xbe\x80-\xe1\xbe\xb4\xe1\xbe\xb6-\xe1\xbe\xbc\xe1\xbe\xbe"
    "\xe1\xbf\x82-\xe1\xbf\x84\xe1\xbf\x86-\xe1\xbf\x8c\xe1\xbf\x90-\xe1\xbf\x93\xe1\xbf\x96-\xe1\xbf\x9b\xe1\xbf\xa0-\xe1\xbf\xac"
    "\xe1\xbf\xb2-\xe1\xbf\xb4\xe1\xbf\xb6-\xe1\xbf\xbc\xe2\x84\x82\xe2\x84\x87\xe2\x84\x8a-\xe2\x84\x93\xe2\x84\x95"
    "\xe2\x84\x99-\xe2\x84\x9d\xe2\x84\xa4\xe2\x84\xa6\xe2\x84\xa8\xe2\x84\xaa-\xe2\x84\xad\xe2\x84\xaf-\xe2\x84\xb4\xe2\x84\xb9"
    "\xe2\x84\xbc-\xe2\x84\xbf\xe2\x85\x85-\xe2\x85\x89\xe2\x85\x8e\xe2\x86\x83\xe2\x86\x84\xe2\xb0\x80-\xe2\xb1\xbb"
    "\xe2\xb1\xbe-\xe2\xb3\xa4\xe2\xb3\xab-\xe2\xb3\xae\xe2\xb3\xb2\xe2\xb3\xb3\xea\x99\x80-\xea\x99\xad\xea\x9a\x80-\xea\x9a\x9b"
    "\xea\x9c\xa2-\xea\x9d\xaf\xea\x9d\xb1-\xea\x9e\x87\xea\x9e\x8b-\xea\x9e\x8e\xea\xad\xb0-\xea\xae\xbf\xef\xac\x80-\xef\xac\x86"
    "\xef\xac\x93-\xef\xac\x97\xef\xbc\xa1-\xef\xbc\xba\xef\xbd\x81-\xef\xbd\x9a\xf0\x90\x90\x80-\xf0\x90\x91\x8f"
    "\xf0\x90\x92\xb0-\xf0\x90\x93\x93\xf0\x90\x93\x98-\xf0\x90\x93\xbb\xf0\x90\xb2\x80-\xf0\x90\xb2\xb2\xf0\x90\xb3\x80-\xf0\x90\xb3\xb2"
    "\xf0\x91\xa2\xa0-\xf0\x91\xa3\x9f\xf0\x9e\xa4\x80-\xf0\x9e\xa5\x83]+",
    "\\s?[!-/:-~\xef\xbc\x81-\xef\xbc\x8f\xef\xbc\x9a-\xef\xbd\x9e\xe2\x80\x98-\xe2\x80\x9f\xe3\x80\x80-\xe3\x80\x82]+",
    "\\s+$",
    RX_CJK,
    "\\p{N}+",
    NULL};
static const char *const PRE_DEEPSEEK3[] = {"\\p{N}{1,3}", RX_HAN_KANA, RX_DS3_PUNCT_WORDS, NULL};
static const char *const PRE_SPARK2_5[] = {
    "\\p{N}{1,3}", RX_HAN_KANA,
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+|[\r\n]|"
    "\\s+(?!\\S)|\\s+",
    "\\p{N}", NULL};
static const char *const PRE_DEEPSEEK_CODER[] = {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RX_CJK, "\\p{N}", NULL};
static const char *const PRE_FALCON[] = {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RX_GPT2, "[0-9][0-9][0-9]", NULL};
static const char *const PRE_STARCODER[] = {"\\p{N}", RX_GPT2, NULL};
static const char *const PRE_GPT2[] = {RX_GPT2, NULL};
static const char *const PRE_QWEN2[] = {RX_QWEN2, NULL};
static const char *const PRE_QWEN35[] = {
    RX_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL};
static const char *const PRE_PORO[] = {RX_PORO, NULL};
static const char *const PRE_VIKING[] = {RX_PORO, "\\p{N}", NULL};
static const char *const PRE_TEKKEN[] = {
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+"
    "((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL};
static const char *const PRE_CHAMELEON[] = {"<sentinel:[0-9]+>",
                                            "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
                                            "([\\t\\n]|    |  )",
                                            "\\p{N}",
                                            "[\\p{P}!-/:-@\\[-`{-~]",
                                            RX_GPT2,
                                            NULL};
static const char *const PRE_GPT4O[] = {RX_UPPER_LOWER, NULL};
static const char *const PRE_GRANITE_EMB_MULTI[] = {
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))*((?=[\\p{L}\\p{M}])([^A-Z]))+" RX_CONTRACTIONS
    "?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))+((?=[\\p{L}\\p{M}])([^A-Z]))*" RX_CONTRACTIONS
    "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL};
static const char *const PRE_TINY_AYA[] = {
    "\\d{1,3}(?=(?:\\d{3})*\\b)",
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" RX_CONTRACTIONS
    "?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*" RX_CONTRACTIONS
    "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL};
static const char *const PRE_SUPERBPE[] = {"\\p{N}+", "(?=(\\d{3})+(?!\\d))", NULL};
static const char *const PRE_BAILINGMOE[] = {
    "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|"
    "\\s+(?!\\S)|\\s+",
    NULL};
static const char *const PRE_SEED_CODER[] = {
    RX_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+", NULL};
static const char *const PRE_UFAKZEKA[] = {
    "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+", NULL};
static const char *const PRE_LAGUNA[] = {"[^\\n]+|[\\n]+", RX_QWEN2, NULL};
static const char *const PRE_EXAONE_MOE[] = {
    RX_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|"
                    "\\s+(?!\\S)|\\s+",
    NULL};
static const char *const PRE_GEMMA4[] = {"[^\\n]+|[\\n]+", NULL};
static const char *const PRE_MINICPM5[] = {
    "\\p{N}{1,3}",
    RX_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+", NULL};

static const gv_pre PRE_DEFS[] = {
  {"default", PRE_DEFAULT, 0},
  {"minicpm5", PRE_MINICPM5, GV_PRE_IGNORE_MERGES},
  {"llama3|llama-v3|llama-bpe|falcon3|falcon-h1|pixtral|midm-2.0|lfm2|jina-v5-nano", PRE_LLAMA3, GV_PRE_IGNORE_MERGES | GV_PRE_ADD_BOS},
  {"jais-2", PRE_JAIS2, 0},
  {"dbrx|smaug-bpe", PRE_LLAMA3, 0},
  {"deepseek-llm", PRE_DEEPSEEK_LLM, GV_PRE_NOCLEAN},
  {"deepseek-coder", PRE_DEEPSEEK_CODER, GV_PRE_NOCLEAN},
  {"deepseek-v3|hunyuan-dense|hy_v4|joyai-llm", PRE_DEEPSEEK3, GV_PRE_NOCLEAN},
  {"spark2_5", PRE_SPARK2_5, GV_PRE_NOCLEAN},
  {"falcon", PRE_FALCON, 0},
  {"mpt|olmo|jais", PRE_GPT2, 0},
  {"trillion|granite-docling", PRE_GPT2, GV_PRE_NOCLEAN},
  {"starcoder|refact|codeshell|exaone|minerva-7b|mellum2", PRE_STARCODER, 0},
  {"command-r|smollm", PRE_STARCODER, GV_PRE_NOCLEAN},
  {"gpt-2|phi-2|jina-es|jina-de|gigachat|jina-v2-es|jina-v2-de|a.x-4.0|mellum|modern-bert|exaone4", PRE_GPT2, 0},
  {"jina-v1-en|jina-v2-code|roberta-bpe", PRE_GPT2, GV_PRE_ADD_SEP},
  {"qwen2|deepseek-r1-qwen|kormo|f2llmv2|hunyuan|solar-open", PRE_QWEN2, GV_PRE_NOCLEAN},
  {"stablelm2|megrez", PRE_QWEN2, 0},
  {"qwen35", PRE_QWEN35, GV_PRE_NOCLEAN},
  {"poro-chat", PRE_PORO, GV_PRE_NOCLEAN},
  {"bloom|gpt3-finnish", PRE_PORO, 0},
  {"glm4|chatglm-bpe", PRE_LLAMA3, GV_PRE_NO_BOS},
  {"viking", PRE_VIKING, GV_PRE_NOCLEAN},
  {"tekken", PRE_TEKKEN, GV_PRE_NOCLEAN | GV_PRE_IGNORE_MERGES | GV_PRE_ADD_BOS},
  {"chameleon", PRE_CHAMELEON, GV_PRE_NOCLEAN | GV_PRE_ADD_BOS},
  {"gpt-4o|llama4|kanana2|talkie|minimax-m2", PRE_GPT4O, GV_PRE_NOCLEAN},
  {"granite-embed-multi-97m", PRE_GRANITE_EMB_MULTI, GV_PRE_NOCLEAN | GV_PRE_IGNORE_MERGES},
  {"tiny_aya|cohere2moe", PRE_TINY_AYA, GV_PRE_NOCLEAN},
  {"superbpe", PRE_SUPERBPE, GV_PRE_NOCLEAN},
  {"bailingmoe|bailingmoe2|llada-moe", PRE_BAILINGMOE, GV_PRE_NOCLEAN},
  {"seed-coder", PRE_SEED_CODER, GV_PRE_NOCLEAN},
  {"ufakzeka", PRE_UFAKZEKA, GV_PRE_NOCLEAN},
  {"grok-2", PRE_QWEN2, GV_PRE_NOCLEAN},
  {"laguna", PRE_LAGUNA, GV_PRE_NOCLEAN},
  {"exaone-moe", PRE_EXAONE_MOE, 0},
  {"gemma4|granite-embed-multi-311m", PRE_GEMMA4, GV_PRE_ESCAPE_WS | GV_PRE_RAW_UTF8 | GV_PRE_NEWLINE_WORDS},
  {"sarvam-moe", PRE_GEMMA4, GV_PRE_NOCLEAN | GV_PRE_ESCAPE_WS | GV_PRE_RAW_UTF8},
};

const gv_pre *gv_find_pre(const char *name) {
  size_t nl = strlen(name);
  for (size_t i = 0; i < sizeof PRE_DEFS / sizeof PRE_DEFS[0]; i++) {
    const char *p = PRE_DEFS[i].names;
    while (*p) {
      const char *e = strchr(p, '|');
      size_t l = e ? (size_t)(e - p) : strlen(p);
      if (l == nl && memcmp(p, name, l) == 0) return &PRE_DEFS[i];
      p += l + (e ? 1 : 0);
    }
  }
  return NULL;
}
