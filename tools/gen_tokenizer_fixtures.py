#!/usr/bin/env python3
"""Generates the tokenizer fixtures under tests/fixtures/tokenizer/.

  tools/gen_tokenizer_fixtures.py corpus
      (re)writes tests/fixtures/tokenizer/corpus.json: a fixed, seeded list of
      strings (many scripts, emoji, whitespace, code, numbers, special-token text).

  tools/gen_tokenizer_fixtures.py expected --deps .deps/tokenizers --out DIR
      needs HF `tokenizers` (run on the GPU machine). Writes into DIR:
      - expected_<name>.json for each real tokenizer.json in --deps: ids from
        Tokenizer.from_file(...).encode(s, add_special_tokens=True/False) and the
        decode (skip_special_tokens=False and True) of the add_special ids.
      - synth_<name>.tokenizer.json + synth_<name>.expected.json: small
        tokenizers trained on the corpus that exercise the components the real
        ones do not (WordPiece, Unigram, BERT pieces, Roberta, added-token flags...).
      - variants.base.json + variants.json: one byte-level BPE and a list of
        normalizer / pre-tokenizer variants spliced into it, with expected ids.

Everything is deterministic: same inputs, same outputs. The committed files
were made with tokenizers 0.23.2 on the GPU machine, where .deps/tokenizers
(over the 64 MiB a run may carry) travels as .carry/tokz/deps.tar.xz
(`tar cJf .carry/tokz/deps.tar.xz -C .deps tokenizers`) and is unpacked
into .deps before `... expected --deps .deps/tokenizers --out $OUT/fx`.
"""
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "tests", "fixtures", "tokenizer")

# ----------------------------------------------------------------------------
# The corpus
# ----------------------------------------------------------------------------

SAMPLES = [
    "", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \r\n ", "\t\t\t", " \t \n ", "\u00a0", "\u3000",
    "Hello world", " Hello world", "Hello World", " Hello World!", "Hello, world!", "hello   world",
    "Hello\tworld", "Hello\r\nworld\r\n", "trailing space ", " leading space", "  both  ",
    "I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL",
    "The quick brown fox jumps over the lazy dog.",
    "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG",
    "Führer Straße naïve café résumé coöperate",
    "Cửa Việt Tiếng Việt có dấu",
    "нещо на Български", "Привет, как дела? Всё хорошо.", "Съешь же ещё этих мягких французских булок",
    "Γειά σου Κόσμε· ὁ ἄνθρωπος", "Ελληνικά: αβγδεζηθικλμνξοπρστυφχψω",
    "שלום עולם! עִבְרִית", "مرحبا بالعالم، كيف حالك؟", "العربية: ١٢٣٤٥٦٧٨٩٠",
    "नमस्ते दुनिया, आप कैसे हैं?", "हिन्दी में क्षत्रिय ज्ञान",
    "สวัสดีครับ ภาษาไทยไม่มีช่องว่าง", "กรุงเทพมหานคร",
    "안녕하세요 세계", "한국어 텍스트입니다. 띄어쓰기도 있어요.",
    "你好，世界！", "我想在apple工作1314151天～", "中文文本，没有空格。简体与繁體混合。",
    "日本語のテキストです。カタカナとひらがな。", "ｶﾀｶﾅ半角 ＦＵＬＬＷＩＤＴＨ １２３",
    "កាន់តែពិសេសអាច", "ქართული ენა", "Հայերեն լեզու", "ᚠᛇᚻ᛫ᛒᛦᚦ", "አማርኛ ቋንቋ",
    "தமிழ் மொழி", "বাংলা ভাষা", "ગુજરાતી", "ਪੰਜਾਬੀ", "తెలుగు", "ಕನ್ನಡ", "മലയാളം", "සිංහල", "ພາສາລາວ", "မြန်မာ",
    "Tiếng Việt", "Türkçe: ığüşöç İstanbul", "Polski: zażółć gęślą jaźń", "Čeština: příliš žluťoučký kůň",
    "🚀 (normal) 😶‍🌫️ (multiple emojis concatenated) ✅ 🦙🦙",
    "👨‍👩‍👧‍👦 family", "👍🏽 👍🏿 👋🏻", "🏳️‍🌈 🏴‍☠️", "❤️‍🔥", "🇺🇸🇯🇵🇩🇪", "😀😃😄😁😆😅😂🤣",
    "a\u0301 e\u0300 o\u0308 n\u0303", "e\u0301\u0302\u0303\u0304", "Å vs A\u030a", "ﬁ ﬂ ﬀ ㎏ ™ ½ ① Ⅻ",
    "\u200b zero\u200bwidth\u200c\u200d", "\ufeffBOM at start", "soft\u00adhyphen",
    "3", "33", "333", "3333", "33333", "333333", "3333333", "33333333", "333333333",
    "3.3 3..3 3...3", "1,234,567.89", "-42 +42 4e10 0x1F 0b1010", "π ≈ 3.14159265358979323846",
    "12345678901234567890123456789012345678901234567890",
    "Phone: +1 (555) 123-4567, ZIP 90210", "2024-01-15T12:34:56Z",
    "!!!!!!", "?????", "......", "''''''```````\"\"\"\"", "------=======", "~~~~ ^^^^ ____",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "int main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
    "for (let i = 0; i < 10; i++) { console.log(`i=${i}`); }",
    "SELECT * FROM users WHERE id = 42 AND name LIKE '%bob%';",
    "<html><body><div class=\"x\">Hi &amp; bye</div></body></html>",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}}",
    "fn main() -> Result<(), Box<dyn Error>> { Ok(()) }",
    "    indented with spaces\n\tindented with tab\n",
    "path/to/file.txt C:\\Windows\\System32 https://example.com/a?b=c&d=e#frag",
    "user@example.com @mention #hashtag $100 50% a&b a|b a^b",
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "Text with <|endoftext|> in the middle", "<|im_start|><|im_end|>",
    "<s>[INST] What is 2+2? [/INST]</s>", "<s> <s>  </s>", "a<s>b</s>c", "<unk> and <pad>",
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n", "<bos><eos>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<｜begin▁of▁sentence｜>Hello<｜end▁of▁sentence｜>", "<think>\nreasoning\n</think>\nanswer",
    "<|startoftext|>hi<|return|>", "<|channel|>analysis<|message|>ok<|end|>",
    "[CLS] [SEP] [MASK] [UNK] [PAD]", "<mask> hello world Hello NORM",
    "▁leading metaspace ▁▁ double", "<0x41> literal byte token text",
    "Ġ Ċ ĉ byte-level lookalikes", "tab\tseparated\tvalues\t", "line1\nline2\rline3\r\nline4",
    "   \n\n   \n", "\n\n\n\n\n", "\t \t \t", "word" + " " * 20 + "word", "x" * 64,
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "abababababababababababab",
    "Mixed 中文 and English 混合 text 123 and 한국어",
    "¿Qué tal? ¡Muy bien! Ça va? Öffnung", "«quotes» „German“ “curly” ‘single’",
    "em—dash en–dash … ellipsis • bullet", "∀x∈ℝ: x² ≥ 0 ∑∫∂√∞", "€ £ ¥ ₹ ₿ ¢",
    "Unicode\u2028line\u2029separators", "NUL\u0000char", "ctrl\u0001\u0002\u001f chars",
    "\U0001F600\U0001F64F\U0001F680\U0001F6FF", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕸𝖆𝖙𝖍", "𐍈 𓀀 𠀀 𪚥",
    "don't won't can't shouldn't y'all ma'am", "'s 't 're 've 'm 'll 'd", "ALL CAPS'S TEST'LL",
    "CamelCaseIdentifier snake_case_identifier kebab-case-identifier SCREAMING_CASE",
    "HTTPServerError XMLHttpRequest getHTTPResponseCode", "iPhone eBay McDonald's O'Reilly",
]

WORDS = ["the", "of", "tokenizer", "hearth", "model", "Hello", "world", "数据", "模型", "テスト", "данные",
         "مرحبا", "नमस्ते", "ภาษา", "한국", "λόγος", "שלום", "🙂", "👩‍💻", "🦙", "1234", "3.14", "x=1;",
         "foo_bar", "<|im_start|>", "<s>", "</s>", "<start_of_turn>", "<|endoftext|>", "don't", "...",
         "e\u0301", "Ω", "ß", "İ", "ﬁ", "½", "\u00a0", "a\u0308"]
SEPS = [" ", "  ", "", "\n", "\t", " \n", "\r\n", ", ", ". ", "   ", "\n\n"]


def build_corpus():
    rng = random.Random(1234)
    out = list(SAMPLES)
    # Each sample with a leading and a trailing space variant (where it has text).
    for s in SAMPLES[:120]:
        if s.strip():
            out.append(" " + s)
            out.append(s + " ")
    # Random mixtures of words and separators.
    while len(out) < 560:
        n = rng.randint(1, 14)
        parts = []
        for _ in range(n):
            parts.append(rng.choice(WORDS))
            parts.append(rng.choice(SEPS))
        if rng.random() < 0.3:
            parts.insert(0, rng.choice([" ", "  ", "\n", "\t"]))
        out.append("".join(parts))
    # A few long strings: digit runs, whitespace runs, a paragraph.
    out.append("".join(str(rng.randint(0, 9)) for _ in range(600)))
    out.append(" " * 300 + "x" + "\t" * 50 + "\n" * 40)
    out.append(" ".join(rng.choice(WORDS) for _ in range(700)))
    out.append(("Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 30).strip())
    return out


# ----------------------------------------------------------------------------
# Expected outputs from HF tokenizers
# ----------------------------------------------------------------------------

def enc(tok, texts, special):
    return [tok.encode(t, add_special_tokens=special).ids for t in texts]


def real_expected(deps, corpus, out):
    from tokenizers import Tokenizer
    for name in sorted(os.listdir(deps)):
        path = os.path.join(deps, name, "tokenizer.json")
        if not os.path.exists(path):
            continue
        tok = Tokenizer.from_file(path)
        sp = enc(tok, corpus, True)
        plain = enc(tok, corpus, False)
        rec = {
            "name": name,
            "encode_special": sp,
            "encode_plain": plain,
            "decode": [tok.decode(ids, skip_special_tokens=False) for ids in sp],
            "decode_skip": [tok.decode(ids, skip_special_tokens=True) for ids in sp],
        }
        with open(os.path.join(out, "expected_%s.json" % name), "w", encoding="utf-8") as f:
            json.dump(rec, f, ensure_ascii=False, separators=(",", ":"))
        print(name, "ok")


def synth_tokenizers(corpus):
    """Small tokenizers trained on the corpus, one per family of components."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    made = {}

    def attempt(name, fn):
        try:
            made[name] = fn()
        except Exception as e:
            print("synth", name, "failed:", repr(e))

    def bert():
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
        tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.train_from_iterator(corpus, trainers.WordPieceTrainer(vocab_size=1500, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
        tok.post_processor = processors.BertProcessing(("[SEP]", tok.token_to_id("[SEP]")), ("[CLS]", tok.token_to_id("[CLS]")))
        tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
        return tok
    attempt("wordpiece_bert", bert)

    def wp_cased():
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=12))
        tok.normalizer = normalizers.Sequence([normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=False, strip_accents=True, lowercase=False), normalizers.Strip()])
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation(behavior="isolated"), pre_tokenizers.Digits(individual_digits=True)])
        tok.train_from_iterator(corpus, trainers.WordPieceTrainer(vocab_size=1200, special_tokens=["[UNK]", "[CLS]", "[SEP]"]))
        tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                           special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
        tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
        return tok
    attempt("wordpiece_cased", wp_cased)

    unigram_vocab = []

    def unigram():
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")])
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
        tok.train_from_iterator(corpus, trainers.UnigramTrainer(vocab_size=1200, special_tokens=["<pad>", "<unk>", "<s>", "</s>"], unk_token="<unk>"))
        tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", pair="<s> $A </s> $B </s>",
                                                           special_tokens=[("<s>", tok.token_to_id("<s>")), ("</s>", tok.token_to_id("</s>"))])
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
        unigram_vocab.extend(json.loads(tok.to_str())["model"]["vocab"])
        return tok
    attempt("unigram_metaspace", unigram)

    def unigram_bf():
        vocab = [tuple(v) for v in unigram_vocab]
        have = {p for p, _ in vocab}
        for b in range(256):
            piece = "<0x%02X>" % b
            if piece not in have:
                vocab.append((piece, -20.0))
        tok = Tokenizer(models.Unigram(vocab, unk_id=1, byte_fallback=True))
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(content=" ", left=1, right=0)])
        tok.add_special_tokens(["<s>", "</s>"])
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", tok.token_to_id("<s>"))])
        return tok
    attempt("unigram_bytefallback", unigram_bf)

    def unigram_first():
        vocab = [tuple(v) for v in unigram_vocab]
        tok = Tokenizer(models.Unigram(vocab, unk_id=1, byte_fallback=False))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        tok.add_special_tokens(["<s>", "</s>", AddedToken("<mask>", lstrip=True, special=True)])
        return tok
    attempt("unigram_first", unigram_first)

    def bpe_suffix():
        tok = Tokenizer(models.BPE(unk_token="<unk>", end_of_word_suffix="</w>"))
        tok.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.StripAccents(), normalizers.Lowercase()])
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tok.train_from_iterator(corpus[:300], trainers.BpeTrainer(vocab_size=1000, special_tokens=["<unk>", "<s>", "</s>"], end_of_word_suffix="</w>", limit_alphabet=200))
        tok.decoder = decoders.BPEDecoder(suffix="</w>")
        return tok
    attempt("bpe_suffix", bpe_suffix)

    def bpe_prefix_fuse():
        tok = Tokenizer(models.BPE(unk_token="<unk>", continuing_subword_prefix="##", fuse_unk=True))
        tok.normalizer = normalizers.NFKD()
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.train_from_iterator(corpus[:250], trainers.BpeTrainer(vocab_size=900, special_tokens=["<unk>", "[CLS]", "[SEP]"], continuing_subword_prefix="##", limit_alphabet=150))
        tok.post_processor = processors.BertProcessing(("[SEP]", tok.token_to_id("[SEP]")), ("[CLS]", tok.token_to_id("[CLS]")))
        tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
        return tok
    attempt("bpe_prefix_fuse", bpe_prefix_fuse)

    def roberta():
        tok = Tokenizer(models.BPE())
        tok.normalizer = normalizers.Lowercase()
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
        tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=1500, special_tokens=["<s>", "<pad>", "</s>", "<unk>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        tok.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=False, special=True, normalized=False)])
        tok.add_tokens([AddedToken("hello", single_word=True, normalized=False),
                        AddedToken(" world", rstrip=True, normalized=False),
                        AddedToken("NORM", normalized=True),
                        AddedToken("数据", lstrip=True, rstrip=True, normalized=False),
                        AddedToken("tok", single_word=True, normalized=True)])
        tok.post_processor = processors.RobertaProcessing(("</s>", tok.token_to_id("</s>")), ("<s>", tok.token_to_id("<s>")), trim_offsets=True, add_prefix_space=True)
        tok.decoder = decoders.ByteLevel()
        return tok
    attempt("bytelevel_roberta", roberta)

    def gpt2_noregex():
        tok = Tokenizer(models.BPE(ignore_merges=True))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=1300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        tok.post_processor = processors.Sequence([processors.ByteLevel(trim_offsets=True),
                                                  processors.TemplateProcessing(single="$A <|endoftext|>", pair="$A <|endoftext|> $B:1 <|endoftext|>:1",
                                                                                special_tokens=[("<|endoftext|>", tok.token_to_id("<|endoftext|>"))])])
        tok.decoder = decoders.ByteLevel()
        return tok
    attempt("bytelevel_ignore_merges", gpt2_noregex)
    return made


def variants(corpus):
    """A byte-level BPE with no splitting, and normalizer / pre-tokenizer variants spliced into it."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    base = Tokenizer(models.BPE())
    base.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    base.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=1200, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    base.decoder = decoders.ByteLevel()
    bl = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    P = pre_tokenizers
    N = normalizers
    pres = {}
    for beh in ["removed", "isolated", "merged_with_previous", "merged_with_next", "contiguous"]:
        for inv in [False, True]:
            pres["split_ws_%s_%s" % (beh, inv)] = P.Split(Regex(r"\s+"), beh, invert=inv)
        pres["split_str_%s" % beh] = P.Split("a", beh)
        pres["punct_%s" % beh] = P.Punctuation(behavior=beh)
    pres["split_letters_isolated"] = P.Split(Regex(r"\p{L}+|\p{N}"), "isolated")
    pres["digits"] = P.Digits(individual_digits=False)
    pres["digits_individual"] = P.Digits(individual_digits=True)
    pres["whitespace"] = P.Whitespace()
    pres["whitespace_split"] = P.WhitespaceSplit()
    pres["bert"] = P.BertPreTokenizer()
    pres["metaspace_always"] = P.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    pres["metaspace_first_nosplit"] = P.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    pres["metaspace_never"] = P.Metaspace(replacement="_", prepend_scheme="never", split=True)
    pres["bytelevel_prefix_regex"] = P.ByteLevel(add_prefix_space=True, use_regex=True)
    norms = {
        "nfd": N.NFD(), "nfkd": N.NFKD(), "nfc": N.NFC(), "nfkc": N.NFKC(), "lowercase": N.Lowercase(),
        "strip": N.Strip(left=True, right=True), "strip_left": N.Strip(left=True, right=False),
        "prepend": N.Prepend("▁"), "replace_regex": N.Replace(Regex(r"\d+"), "#"),
        "replace_str": N.Replace("  ", " "), "strip_accents": N.Sequence([N.NFD(), N.StripAccents()]),
        "bert_default": N.BertNormalizer(), "bert_nolower": N.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=False, lowercase=False),
        "bert_strip": N.BertNormalizer(clean_text=False, handle_chinese_chars=False, strip_accents=True, lowercase=False),
        "seq": N.Sequence([N.NFKC(), N.Lowercase(), N.Replace(Regex(r"\s+"), " "), N.Strip()]),
    }
    texts = corpus[:160]
    out = []
    for name, p in pres.items():
        base.pre_tokenizer = P.Sequence([p, bl])
        base.normalizer = None
        j = json.loads(base.to_str())
        out.append({"name": "pre_" + name, "normalizer": None, "pre_tokenizer": j["pre_tokenizer"], "ids": enc(base, texts, False)})
    base.pre_tokenizer = bl
    for name, n in norms.items():
        base.normalizer = n
        j = json.loads(base.to_str())
        out.append({"name": "norm_" + name, "normalizer": j["normalizer"], "pre_tokenizer": j["pre_tokenizer"], "ids": enc(base, texts, False)})
    base.normalizer = None
    base.pre_tokenizer = bl
    return base.to_str(), {"count": len(texts), "variants": out}


def expected(deps, out):
    import tokenizers
    print("tokenizers", tokenizers.__version__)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(FIX, "corpus.json"), encoding="utf-8") as f:
        corpus = json.load(f)
    real_expected(deps, corpus, out)
    for name, tok in synth_tokenizers(corpus).items():
        with open(os.path.join(out, "synth_%s.tokenizer.json" % name), "w", encoding="utf-8") as f:
            f.write(tok.to_str())
        sp = enc(tok, corpus, True)
        rec = {"name": name, "encode_special": sp, "encode_plain": enc(tok, corpus, False),
               "decode": [tok.decode(ids, skip_special_tokens=False) for ids in sp],
               "decode_skip": [tok.decode(ids, skip_special_tokens=True) for ids in sp]}
        with open(os.path.join(out, "synth_%s.expected.json" % name), "w", encoding="utf-8") as f:
            json.dump(rec, f, ensure_ascii=False, separators=(",", ":"))
        print("synth", name, "ok")
    base, var = variants(corpus)
    with open(os.path.join(out, "variants.base.json"), "w", encoding="utf-8") as f:
        f.write(base)
    with open(os.path.join(out, "variants.json"), "w", encoding="utf-8") as f:
        json.dump(var, f, ensure_ascii=False, separators=(",", ":"))
    print("variants ok", len(var["variants"]))


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "corpus":
        os.makedirs(FIX, exist_ok=True)
        corpus = build_corpus()
        with open(os.path.join(FIX, "corpus.json"), "w", encoding="utf-8") as f:
            json.dump(corpus, f, ensure_ascii=False, indent=0)
        print(len(corpus), "strings")
    elif len(sys.argv) >= 2 and sys.argv[1] == "expected":
        args = dict(zip(sys.argv[2::2], sys.argv[3::2]))
        expected(args.get("--deps", ".deps/tokenizers"), args.get("--out", FIX))
    else:
        print(__doc__)
        sys.exit(2)


if __name__ == "__main__":
    main()
