#!/usr/bin/env python3
"""Trains hearth's built-in default model (models/default/) from scratch.

What it makes: a byte-level BPE tokenizer (HF `tokenizers`) and a small
`LlamaForCausalLM` (transformers' own class, so the folder is a standard HF
llama folder), trained on the King James Bible (public domain; fetched by
tools/fetch_default_corpus.sh) plus a small share of chat-formatted
conversations built from the same verses. It also records the golden fixture
tests/fixtures/default_model/greedy.json (transformers' greedy continuations
and last-position logits, float32 compute on the saved bf16 weights) and
writes models/default/MODEL_CARD.md with the numbers of this very run.

Runs on one GPU (PyTorch, transformers, tokenizers, Jinja2):
    PYTHONUNBUFFERED=1 python3 tools/train_default_model.py
`--prepare-only` runs just the data preparation (standard library + Jinja2),
which is how it is checked on a machine without torch.

Deterministic given --seed: Python, torch and the window sampler are seeded,
cuBLAS runs with a fixed workspace, attention is the eager (matmul + softmax)
path and torch.use_deterministic_algorithms is on; the tokenizer is trained
twice and the two results compared. Any op that still reports itself as
nondeterministic is listed in the model card.
"""
import argparse
import json
import math
import os
import random
import re
import shlex
import sys
import time

# ---------------------------------------------------------------- constants

SPECIAL_TOKENS = ["<|bos|>", "<|eos|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
BOS, EOS, END = "<|bos|>", "<|eos|>", "<|end|>"

# The chat format (the same as Phi-3's): every turn is "<|role|>\n" + text + "<|end|>\n",
# the whole conversation led by <|bos|>; generation stops at <|end|> (or <|eos|>,
# which closes plain-text documents).
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

# The pre-tokenizer split (Qwen2's pattern), then GPT-2's byte-to-unicode map.
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

REF_RE = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+)$")
WORD_RE = re.compile(r"[A-Za-z]+")

TOPICS = [
    "love", "light", "wisdom", "peace", "water", "fire", "king", "bread", "wine", "mercy",
    "truth", "fear", "joy", "heart", "sea", "mountain", "city", "gold", "sword", "shepherd",
    "sheep", "river", "rain", "tree", "garden", "star", "sun", "night", "morning", "house",
    "land", "children", "father", "mother", "brother", "friend", "enemy", "war", "death",
    "life", "spirit", "faith", "hope", "glory", "praise", "strength", "word", "law",
    "prayer", "sin", "righteousness", "grace", "salvation", "kingdom", "earth", "heaven",
    "voice", "path", "way", "rock", "lion", "fruit", "harvest", "seed", "field",
    "wilderness", "temple", "silver", "stone", "wind", "cloud", "darkness", "lamp",
    "servant", "judgment", "covenant", "prophet", "angel", "riches", "poor", "widow",
    "stranger", "forgiveness", "patience", "honour", "kindness", "knowledge", "understanding",
    "labour", "song", "music", "bird", "horse", "ship", "fish", "wheat", "oil", "honey",
]

TOPIC_QUESTIONS = [
    "Give me a verse about {w}.", "Tell me a verse about {w}.", "Share a verse about {w}.",
    "What does the Bible say about {w}?", "Write a verse about {w}.", "Say something about {w}.",
    "I need a verse about {w}.", "Speak to me of {w}.", "A verse on {w}, please.",
    "What is written about {w}?", "{W}.", "Tell me about {w}.",
]
CONTINUE_QUESTIONS = [
    "Continue this verse: {h}", "Finish the verse: {h}", "Complete this: {h}",
    "How does this verse go on? {h}", "{h}",
]
PROVERB_QUESTIONS = ["Give me a proverb about {w}.", "Tell me a proverb about {w}.",
                     "What do the proverbs say about {w}?"]
PSALM_QUESTIONS = ["Write a psalm about {w}.", "Sing me a psalm of {w}.", "A psalm about {w}, please."]
STORY_QUESTIONS = ["Tell me a story.", "Tell me a story, please.", "Tell me something that happened.",
                   "Can you tell me a story?", "Once upon a time...", "Tell me a tale."]
STORY_BOOKS = {"Ge", "Exo", "Num", "Josh", "Jdgs", "Ruth", "1Sm", "2Sm", "1Ki", "2Ki", "Est",
               "Dan", "Jonah", "Mat", "Mark", "Luke", "John", "Acts"}
WISDOM_BOOKS = {"Prv", "Psa", "Eccl", "Job"}

# Everyday openings, each answered with a verse (from the wisdom books, one that
# holds one of the listed words when there is one).
SMALL_TALK = [
    ("Hello", []), ("Hello!", []), ("Hi", []), ("Hi there.", []), ("Hey", []),
    ("Good morning.", ["morning"]), ("Good evening.", ["evening"]), ("Good night.", ["night", "sleep"]),
    ("How are you?", ["peace"]), ("Tell me something.", []), ("Say something.", []),
    ("Say something wise.", ["wisdom", "wise"]), ("Give me some advice.", ["counsel", "wise"]),
    ("What should I do?", ["way", "path"]), ("I am sad.", ["sorrow", "comfort", "weep"]),
    ("I am afraid.", ["fear", "afraid"]), ("I am tired.", ["rest", "weary"]),
    ("I am happy today.", ["joy", "rejoice", "glad"]), ("Thank you.", ["thanks", "praise"]),
    ("Thanks!", ["thanks", "praise"]), ("What is the meaning of life?", ["life", "vanity"]),
    ("Can you help me?", ["help"]), ("Write something.", []), ("Write me a poem.", ["sing", "song"]),
    ("What is love?", ["love"]), ("What is wisdom?", ["wisdom"]), ("Are you there?", []),
    ("I feel alone.", ["alone", "forsake"]), ("What time is it?", ["time", "season"]),
    ("Goodbye.", ["peace"]), ("Bless me.", ["bless"]), ("Teach me.", ["teach", "learn"]),
]

IDENTITY_QUESTIONS = ["Who are you?", "What are you?", "What is your name?", "What can you do?",
                      "Are you a person?", "Tell me about yourself.", "Who made you?"]
IDENTITY_ANSWERS = [
    "I am the small model that ships with hearth. I was trained only on the King James Bible, "
    "so I speak in its manner of English; I know little else.",
    "I am a small language model, the built-in model of hearth. I learned from the King James "
    "Bible alone, and I answer in its words and its style.",
    "I am hearth's built-in model: a small model trained on the King James Bible. I can write "
    "verses in its manner, but I do not know the world beyond it.",
]
SYSTEM_PROMPTS = ["You are a helpful assistant.", "You are hearth's built-in model.",
                  "Answer briefly.", "Answer in the style of the King James Bible."]


# ---------------------------------------------------------------- data preparation

def read_verses(path):
    """Returns chapters: a list of (book, chapter, [verse texts]) in canonical order."""
    chapters, index = [], {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line:
                continue
            ref, sep, text = line.partition("\t")
            m = REF_RE.match(ref)
            if not sep or not m or not text.strip():
                raise ValueError(f"{path}:{lineno}: expected '<ref>\\t<text>', got {line[:60]!r}")
            key = (m.group(1), int(m.group(2)))
            if key not in index:
                index[key] = len(chapters)
                chapters.append((key[0], key[1], []))
            chapters[index[key]][2].append(text.strip())
    if not chapters:
        raise ValueError(f"{path}: no verses")
    return chapters


def split_chapters(chapters, val_fraction, seed):
    rng = random.Random(seed)
    n_val = max(1, round(len(chapters) * val_fraction))
    val = set(rng.sample(range(len(chapters)), n_val))
    train = [i for i in range(len(chapters)) if i not in val]
    return train, sorted(val)


class VersePool:
    """The verses of some chapters, indexed by lower-case word and by book."""

    def __init__(self, chapters, chapter_ids):
        self.chapters = chapters
        self.refs = []  # (chapter id, verse index)
        self.by_word = {}
        self.by_book = {}
        for c in chapter_ids:
            book = chapters[c][0]
            for v, text in enumerate(chapters[c][2]):
                r = len(self.refs)
                self.refs.append((c, v))
                self.by_book.setdefault(book, []).append(r)
                for w in set(x.lower() for x in WORD_RE.findall(text)):
                    self.by_word.setdefault(w, []).append(r)

    def text(self, r, count=1):
        c, v = self.refs[r]
        verses = self.chapters[c][2]
        return " ".join(verses[v:v + count])

    def with_word(self, rng, words, books=None):
        """A verse holding one of words (restricted to books when given), else None."""
        cands = []
        for w in words:
            cands.extend(self.by_word.get(w, []))
        if books is not None:
            cands = [r for r in cands if self.chapters[self.refs[r][0]][0] in books]
        return rng.choice(cands) if cands else None

    def topic_in(self, rng, books):
        """A topic word and a verse (in books, when given) that holds it."""
        for _ in range(50):
            w = rng.choice(TOPICS)
            r = self.with_word(rng, [w], books)
            if r is not None:
                return w, r
        if books is not None:  # a small pool may lack the book altogether
            return self.topic_in(rng, None)
        raise ValueError("no verse holds any topic word")

    def from_books(self, rng, books):
        cands = [r for b in sorted(books) for r in self.by_book.get(b, [])]
        return rng.choice(cands) if cands else rng.randrange(len(self.refs))


def make_exchange(rng, pool):
    """One (question, answer) pair of some kind, built from the pool's verses."""
    kind = rng.random()
    if kind < 0.40:
        w, r = pool.topic_in(rng, None)
        q = rng.choice(TOPIC_QUESTIONS).format(w=w, W=w.capitalize())
        return q, pool.text(r, 2 if rng.random() < 0.25 else 1)
    if kind < 0.48:
        w, r = pool.topic_in(rng, {"Prv"})
        return rng.choice(PROVERB_QUESTIONS).format(w=w), pool.text(r)
    if kind < 0.56:
        w, r = pool.topic_in(rng, {"Psa"})
        return rng.choice(PSALM_QUESTIONS).format(w=w), pool.text(r, rng.randint(2, 4))
    if kind < 0.76:
        for _ in range(20):
            words = pool.text(rng.randrange(len(pool.refs))).split(" ")
            if len(words) >= 8:
                cut = rng.randint(len(words) * 2 // 5, len(words) * 3 // 5)
                head, tail = " ".join(words[:cut]), " ".join(words[cut:])
                return rng.choice(CONTINUE_QUESTIONS).format(h=head), tail
    if kind < 0.82:
        r = pool.from_books(rng, STORY_BOOKS)
        return rng.choice(STORY_QUESTIONS), pool.text(r, rng.randint(3, 6))
    if kind < 0.97:
        q, words = rng.choice(SMALL_TALK)
        r = pool.with_word(rng, words, WISDOM_BOOKS) if words else None
        if r is None:
            r = pool.from_books(rng, WISDOM_BOOKS)
        return q, pool.text(r)
    return rng.choice(IDENTITY_QUESTIONS), rng.choice(IDENTITY_ANSWERS)


def make_conversations(pool, count, seed):
    rng = random.Random(seed)
    convs = []
    for _ in range(count):
        msgs = []
        if rng.random() < 0.10:
            msgs.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
        for _ in range(2 if rng.random() < 0.20 else 1):
            q, a = make_exchange(rng, pool)
            msgs.append({"role": "user", "content": q})
            msgs.append({"role": "assistant", "content": a})
        convs.append(msgs)
    return convs


def chat_renderer():
    """The chat template compiled the way transformers compiles it."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    tmpl = env.from_string(CHAT_TEMPLATE)
    return lambda messages, add_generation_prompt=False: tmpl.render(
        messages=messages, bos_token=BOS, eos_token=EOS, add_generation_prompt=add_generation_prompt)


def prepare_data(args):
    chapters = read_verses(args.corpus)
    train_ids, val_ids = split_chapters(chapters, args.val_fraction, args.seed)
    render = chat_renderer()
    train_pool, val_pool = VersePool(chapters, train_ids), VersePool(chapters, val_ids)
    n_val_chat = max(1, round(args.chat_convs * args.val_fraction))
    train_convs = make_conversations(train_pool, args.chat_convs, args.seed + 1)
    val_convs = make_conversations(val_pool, n_val_chat, args.seed + 2)
    data = {
        "chapters": chapters,
        "train_chapters": train_ids,
        "val_chapters": val_ids,
        "train_text": ["\n".join(chapters[c][2]) for c in train_ids],
        "val_text": ["\n".join(chapters[c][2]) for c in val_ids],
        "train_chat": [render(m) for m in train_convs],
        "val_chat": [render(m) for m in val_convs],
        "train_convs": train_convs,
    }
    n_verses = sum(len(c[2]) for c in chapters)
    chars_text = sum(len(t) for t in data["train_text"])
    chars_chat = sum(len(t) for t in data["train_chat"])
    data["stats"] = {
        "verses": n_verses, "chapters": len(chapters),
        "train_chapters": len(train_ids), "val_chapters": len(val_ids),
        "train_text_chars": chars_text, "train_chat_chars": chars_chat,
        "train_chat_convs": len(train_convs), "val_chat_convs": len(val_convs),
        "chat_share_chars": round(chars_chat / (chars_text + chars_chat), 4),
    }
    return data


# ---------------------------------------------------------------- tokenizer

def train_tokenizer(data, vocab_size):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, show_progress=False,
        special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())

    # The trainer sees text only: the chat turns without their markers.
    marker = re.compile("|".join(re.escape(s) for s in SPECIAL_TOKENS))

    def texts():
        yield from data["train_text"]
        for conv in data["train_chat"]:
            yield marker.sub("\n", conv)

    tok.train_from_iterator(texts(), trainer=trainer)
    for i, s in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(s) != i:
            raise RuntimeError(f"special token {s} got id {tok.token_to_id(s)}, expected {i}")
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, 0)])
    return tok


def encode_streams(tok, data):
    """Token streams: text documents as <|bos|> text <|eos|>, chats as rendered."""
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)

    def docs_text(texts):
        return [[bos] + e.ids + [eos] for e in tok.encode_batch(texts, add_special_tokens=False)]

    def docs_chat(convs):
        return [e.ids for e in tok.encode_batch(convs, add_special_tokens=False)]

    train_chat = docs_chat(data["train_chat"])
    train_docs = docs_text(data["train_text"]) + train_chat
    random.Random(data["seed"]).shuffle(train_docs)
    flat = lambda docs: [t for d in docs for t in d]
    return {
        "train": flat(train_docs),
        "val_text": flat(docs_text(data["val_text"])),
        "val_chat": flat(docs_chat(data["val_chat"])),
        "train_chat_tokens": sum(len(d) for d in train_chat),
    }


# ---------------------------------------------------------------- model

def build_config(args, vocab_size):
    from transformers import LlamaConfig
    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, head_dim=args.hidden // args.heads,
        max_position_embeddings=args.context, rms_norm_eps=1e-5, hidden_act="silu",
        initializer_range=0.02, tie_word_embeddings=True, attention_bias=False,
        mlp_bias=False, attention_dropout=0.0, use_cache=True,
        bos_token_id=0, eos_token_id=[2, 1], pad_token_id=1,
        attn_implementation="eager")


def stream_windows(stream, T):
    """(inputs, targets): the stream's consecutive windows of T tokens, targets shifted by one."""
    n = (len(stream) - 1) // T
    return stream[:n * T].view(n, T), stream[1:n * T + 1].view(n, T)


def evaluate(model, windows, batch, device):
    """Mean next-token loss (nats) over windows = (inputs, targets)."""
    import torch
    import torch.nn.functional as F
    x_all, y_all = windows
    n = x_all.size(0)
    if n == 0:
        return float("nan")
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad(), torch.autocast(device_type="cuda", dtype=torch.bfloat16):
        for i in range(0, n, batch):
            x, y = x_all[i:i + batch].to(device), y_all[i:i + batch].to(device)
            logits = model(input_ids=x).logits.float()
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), reduction="sum")
            total += loss.item()
            count += y.numel()
    model.train()
    return total / count


def train_model(args, streams, vocab_size, epochs, deadline):
    """One training run of `epochs` epochs (cosine over its own length) that stops at the
    wall-clock deadline; returns the model with the weights of its best validation step."""
    import torch
    import torch.nn.functional as F
    from transformers import LlamaForCausalLM

    torch.manual_seed(args.seed)
    torch.cuda.manual_seed_all(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    device = torch.device("cuda")

    cfg = build_config(args, vocab_size)
    model = LlamaForCausalLM(cfg).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params} parameters, attention={model.config._attn_implementation}")

    train = torch.tensor(streams["train"], dtype=torch.long, device=device)
    val_text = stream_windows(torch.tensor(streams["val_text"], dtype=torch.long), args.context)
    val_chat = stream_windows(torch.tensor(streams["val_chat"], dtype=torch.long), args.context)
    T, B = args.context, args.batch
    tokens_per_step = T * B
    planned = math.ceil(epochs * len(streams["train"]) / tokens_per_step)
    total_steps = min(planned, args.max_steps) if args.max_steps else planned
    eval_every = max(10, total_steps // 25)
    print(f"train tokens {len(streams['train'])}, steps {total_steps} "
          f"({tokens_per_step} tokens/step, {epochs} epochs planned), eval every {eval_every}")

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)

    def lr_at(step):
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        p = (step - args.warmup) / max(1, total_steps - args.warmup)
        return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p)))

    gen = torch.Generator().manual_seed(args.seed)
    offsets = torch.arange(T + 1, device=device)
    history, best = [], {"val": float("inf"), "step": -1, "state": None}
    recent = []
    t_train = time.time()
    stopped_by_time = False
    step = 0
    for step in range(total_steps):
        if time.time() > deadline:
            stopped_by_time = True
            print(f"time budget of {args.time_budget}s reached at step {step}")
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        starts = torch.randint(0, len(streams["train"]) - T - 1, (B,), generator=gen).to(device)
        window = train[starts[:, None] + offsets]
        x, y = window[:, :-1], window[:, 1:]
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            logits = model(input_ids=x).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        recent.append(loss.item())
        recent = recent[-20:]
        last = step == total_steps - 1
        if step % eval_every == 0 or last:
            vt = evaluate(model, val_text, 16, device)
            vc = evaluate(model, val_chat, 16, device)
            elapsed = time.time() - t_train
            rec = {"step": step, "train_loss": sum(recent) / len(recent), "val_text_loss": vt,
                   "val_chat_loss": vc, "lr": lr_at(step), "seconds": round(elapsed, 1)}
            history.append(rec)
            print(f"step {step:5d}  train {rec['train_loss']:.4f}  val_text {vt:.4f}  "
                  f"val_chat {vc:.4f}  lr {rec['lr']:.2e}  {elapsed:6.1f}s  "
                  f"{(step + 1) * tokens_per_step / max(elapsed, 1e-6):,.0f} tok/s")
            if vt < best["val"]:
                best = {"val": vt, "step": step,
                        "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}
    train_seconds = time.time() - t_train
    steps_done = step + (0 if stopped_by_time else 1)
    if best["state"] is not None:
        model.load_state_dict(best["state"])
    print(f"training: {steps_done} steps in {train_seconds:.1f}s; keeping step {best['step']} "
          f"(val_text {best['val']:.4f})")

    # Train loss of the kept weights on fixed windows, measured like the validation loss.
    g2 = torch.Generator().manual_seed(args.seed + 7)
    idx = torch.randint(0, len(streams["train"]) - T - 1, (64,), generator=g2).to(device)
    sample_windows = train[idx[:, None] + offsets].cpu()
    train_sample = (sample_windows[:, :-1], sample_windows[:, 1:])
    result = {
        "epochs": epochs, "parameters": n_params,
        "steps_planned": total_steps, "steps_done": steps_done, "stopped_by_time": stopped_by_time,
        "kept_step": best["step"], "train_seconds": round(train_seconds, 1),
        "tokens_per_step": tokens_per_step, "history": history,
        "final_val_text_loss": evaluate(model, val_text, 16, device),
        "final_val_chat_loss": evaluate(model, val_chat, 16, device),
        "final_train_loss": evaluate(model, train_sample, 16, device),
    }
    return model, result


# ---------------------------------------------------------------- saving, fixture, samples

def save_tokenizer(tok, out_dir, context):
    try:
        from transformers import PreTrainedTokenizerFast as TokenizerClass
    except ImportError:
        from transformers import TokenizersBackend as TokenizerClass
    hf = TokenizerClass(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=EOS,
                                 model_max_length=context)
    hf.save_pretrained(out_dir)
    # The chat template lives inside tokenizer_config.json (not a separate .jinja file).
    cfg_path = os.path.join(out_dir, "tokenizer_config.json")
    with open(cfg_path, encoding="utf-8") as f:
        cfg = json.load(f)
    cfg.update({"chat_template": CHAT_TEMPLATE, "bos_token": BOS, "eos_token": EOS, "pad_token": EOS,
                "add_bos_token": True, "add_eos_token": False, "model_max_length": context})
    cfg.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
    with open(cfg_path, "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")
    for extra in ("chat_template.jinja", "special_tokens_map.json"):
        p = os.path.join(out_dir, extra)
        if os.path.exists(p):
            os.remove(p)


def write_generation_config(out_dir):
    gen = {"bos_token_id": 0, "eos_token_id": [2, 1], "pad_token_id": 1,
           "do_sample": True, "temperature": 0.8, "top_p": 0.95}
    with open(os.path.join(out_dir, "generation_config.json"), "w", encoding="utf-8") as f:
        json.dump(gen, f, indent=2)
        f.write("\n")


def check_tokenizer_folder(hf, tok, render):
    """The saved folder, loaded by transformers, must agree with what training used."""
    ids = hf("In the beginning")["input_ids"]
    expect = [0] + tok.encode("In the beginning", add_special_tokens=False).ids
    if ids != expect:
        raise RuntimeError(f"AutoTokenizer adds specials differently: {ids} vs {expect}")
    msgs = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Peace be unto you."}, {"role": "user", "content": "Who are you?"}]
    for gp in (False, True):
        a = hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gp)
        b = render(msgs, add_generation_prompt=gp)
        if a != b:
            raise RuntimeError(f"chat template renders differently in transformers: {a!r} vs {b!r}")
    if hf.decode(ids, skip_special_tokens=True) != "In the beginning":
        raise RuntimeError("decode does not round-trip")


FIXTURE_CASES = [
    {"name": "text_genesis", "kind": "text", "prompt": "In the beginning God created"},
    {"name": "text_king", "kind": "text", "prompt": "And it came to pass, when the king"},
    {"name": "chat_wisdom", "kind": "chat",
     "messages": [{"role": "user", "content": "Give me a verse about wisdom."}]},
]


def greedy_fixture(model_dir, fixture_path, n_new):
    """transformers' greedy continuation, float32 compute on the saved bf16 weights."""
    import torch
    import transformers
    from transformers import AutoTokenizer, LlamaForCausalLM
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    model.eval().to("cuda")
    cases = []
    last_logits = None
    for case in FIXTURE_CASES:
        c = dict(case)
        if c["kind"] == "chat":
            c["add_generation_prompt"] = True
            c["prompt"] = tok.apply_chat_template(c["messages"], tokenize=False, add_generation_prompt=True)
            ids = tok(c["prompt"], add_special_tokens=False)["input_ids"]
        else:
            ids = tok(c["prompt"])["input_ids"]
        c["prompt_ids"] = list(ids)
        seq, out_ids, margins = list(ids), [], []
        with torch.no_grad():
            for i in range(n_new):
                logits = model(input_ids=torch.tensor([seq], device="cuda"), use_cache=False).logits[0, -1].float()
                top2 = torch.topk(logits, 2)
                if i == 0 and last_logits is None:
                    top = torch.topk(logits, 20)
                    last_logits = {"case": c["name"], "position": len(ids) - 1,
                                   "top_ids": top.indices.tolist(), "top_values": top.values.tolist(),
                                   "all": logits.tolist()}
                nxt = int(top2.indices[0])
                margins.append(float(top2.values[0] - top2.values[1]))
                out_ids.append(nxt)
                seq.append(nxt)
        # The same through generate(), as a cross-check of the loop above.
        try:
            with torch.no_grad():
                gen = model.generate(torch.tensor([ids], device="cuda"), do_sample=False, max_new_tokens=n_new,
                                     eos_token_id=None, pad_token_id=1)[0, len(ids):].tolist()
            if gen[:len(out_ids)] != out_ids[:len(gen)]:
                print(f"note: generate() differs from the step loop for {c['name']}: {gen} vs {out_ids}")
        except Exception as e:  # only a cross-check; the fixture is the loop above
            print(f"note: generate() cross-check failed for {c['name']}: {e}")
        c["greedy_ids"] = out_ids
        c["greedy_text"] = tok.decode(out_ids, skip_special_tokens=False)
        c["min_margin"] = min(margins)
        c["margins"] = [round(m, 5) for m in margins]
        cases.append(c)
    fixture = {
        "generator": "tools/train_default_model.py",
        "model": "models/default",
        "weights_dtype": "bfloat16", "compute_dtype": "float32", "attention": "eager",
        "transformers_version": transformers.__version__, "torch_version": torch.__version__,
        "n_new_tokens": n_new,
        "note": "greedy_ids never stop at an end token: each is the argmax of the last position's "
                "logits over prompt_ids + the ids before it. margins: top-1 minus top-2 logit per step.",
        "cases": cases,
        "last_logits": last_logits,
    }
    os.makedirs(os.path.dirname(fixture_path), exist_ok=True)
    with open(fixture_path, "w", encoding="utf-8") as f:
        json.dump(fixture, f, indent=1, ensure_ascii=False)
        f.write("\n")
    return fixture


SAMPLE_PROMPTS = [
    {"name": "text, greedy", "kind": "text", "prompt": "And it came to pass", "sample": False},
    {"name": "text, sampled", "kind": "text", "prompt": "The LORD is my", "sample": True},
    {"name": "chat, sampled", "kind": "chat", "prompt": "Give me a verse about light.", "sample": True},
    {"name": "chat, sampled", "kind": "chat", "prompt": "Hello! Who are you?", "sample": True},
    {"name": "chat, greedy", "kind": "chat", "prompt": "Tell me a story.", "sample": False},
]


def samples(model_dir, seed):
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval().to("cuda")
    out = []
    for s in SAMPLE_PROMPTS:
        if s["kind"] == "chat":
            text = tok.apply_chat_template([{"role": "user", "content": s["prompt"]}], tokenize=False,
                                           add_generation_prompt=True)
            ids = tok(text, add_special_tokens=False)["input_ids"]
        else:
            ids = tok(s["prompt"])["input_ids"]
        torch.manual_seed(seed)
        kw = {"do_sample": True, "temperature": 0.8, "top_p": 0.95} if s["sample"] else {"do_sample": False}
        with torch.no_grad():
            gen = model.generate(torch.tensor([ids], device="cuda"), max_new_tokens=80,
                                 eos_token_id=[2, 1], pad_token_id=1, **kw)[0, len(ids):].tolist()
        reply = tok.decode(gen, skip_special_tokens=True)
        print(f"--- sample ({s['name']}): {s['prompt']!r}\n{reply}")
        out.append(dict(s, output=reply, stopped=bool(gen and gen[-1] in (1, 2))))
    return out


def write_model_card(path, args, stats, tok_stats, result, fixture, sample_list, timing, env):
    h = result["history"]
    lines = []
    add = lines.append
    add("# hearth's built-in model\n")
    add("A very small language model that ships inside hearth so that `hearth serve` works on a fresh "
        "machine without downloading anything. It was trained from scratch on the King James Bible "
        "and writes English in that style: it knows nothing else, and what it says is imitation, not "
        "knowledge. Use it to see hearth work; point `--model` at a real model folder for real use.\n")
    add("## Data\n")
    add(f"- Source: the King James Version of the Bible (1611), public domain, from Debian's "
        f"`bible-kjv-text` package (read with the `bible` program of `bible-kjv`), fetched and cleaned by "
        f"`tools/fetch_default_corpus.sh` (one verse a line, references stripped).")
    add(f"- {stats['verses']} verses in {stats['chapters']} chapters; {stats['val_chapters']} chapters "
        f"(chosen at random with the seed) are held out for validation, {stats['train_chapters']} train.")
    add(f"- Plain-text documents: one chapter each, verses on separate lines, as `<|bos|>` text `<|eos|>`.")
    add(f"- Chat documents: {stats['train_chat_convs']} generated conversations (and "
        f"{stats['val_chat_convs']} from held-out chapters for validation), "
        f"{stats['chat_share_chars'] * 100:.1f}% of the training characters: a request for a verse about a "
        f"topic answered with a verse holding that word, a proverb or psalm on a topic, the rest of a "
        f"verse whose first half is given, a story (a few consecutive verses), everyday openings "
        f"(\"Hello\", \"I am sad.\") answered with a verse from the wisdom books, and a few fixed "
        f"answers to \"Who are you?\" that say what the model is. Every answer is KJV text except those.")
    add(f"- Tokens: {tok_stats['train_tokens']} training ({tok_stats['train_chat_tokens']} of them chat), "
        f"{tok_stats['val_text_tokens']} validation text, {tok_stats['val_chat_tokens']} validation chat.\n")
    add("## Tokenizer\n")
    add(f"Byte-level BPE trained with HF `tokenizers` on the training split: vocabulary {tok_stats['vocab']} "
        f"(256 byte symbols, {len(SPECIAL_TOKENS)} special tokens, the rest merges), pre-tokenizer = "
        f"Qwen2's split pattern + byte-level mapping, no normalizer, `<|bos|>` prepended by the post-processor. "
        f"Special tokens (ids 0-5): " + ", ".join(f"`{s}`" for s in SPECIAL_TOKENS) + ". "
        f"Training it twice gave {'identical' if tok_stats['deterministic'] else 'DIFFERENT'} results.\n")
    add("Chat format (the `chat_template` in `tokenizer_config.json`, the same shape as Phi-3's):\n")
    add("```\n<|bos|><|system|>\nAnswer briefly.<|end|>\n<|user|>\nGive me a verse about light.<|end|>\n"
        "<|assistant|>\nAnd God said, Let there be light: and there was light.<|end|>\n```\n")
    add("Generation ends at `<|end|>` (id 2) or `<|eos|>` (id 1): both are in `generation_config.json`.\n")
    add("## Architecture\n")
    add(f"`LlamaForCausalLM` (transformers): {args.layers} layers, hidden {args.hidden}, "
        f"{args.heads} attention heads of {args.hidden // args.heads}, {args.kv_heads} key/value heads (GQA), "
        f"SwiGLU MLP {args.intermediate}, RMSNorm (eps 1e-5), RoPE (theta 10000), context {args.context}, "
        f"tied input/output embeddings. **{result['parameters']:,} parameters**, stored as bfloat16 "
        f"({env['safetensors_bytes']:,} bytes of `model.safetensors`).\n")
    add("## Training\n")
    add(f"AdamW (betas 0.9/0.95, weight decay {args.weight_decay} on matrices), peak learning rate {args.lr}, "
        f"{args.warmup} warm-up steps then cosine decay to {args.min_lr_ratio} of the peak, gradient clipping 1.0, "
        f"batches of {args.batch} random windows of {args.context} tokens, bf16 autocast over float32 weights, "
        f"seed {args.seed}. Data this small is easy to overfit, so the script trains one run per "
        f"length in {', '.join(f'{e:g}' for e in args.epochs)} epochs (each its own schedule, same seed), "
        f"keeps in each the weights of the step with the lowest validation loss on held-out text, and "
        f"ships the run whose kept weights score best there: the {result['epochs']:g}-epoch run "
        f"({result['steps_done']} of {result['steps_planned']} steps done"
        f"{', stopped by the time budget' if result['stopped_by_time'] else ''}; kept step "
        f"{result['kept_step']}).\n")
    add("| epochs | steps done / planned | kept step | train loss | val text | val chat | seconds |")
    add("|---:|---:|---:|---:|---:|---:|---:|")
    for r in result["sweep"]:
        add(f"| {r['epochs']:g} | {r['steps_done']} / {r['steps_planned']} | {r['kept_step']} | "
            f"{r['final_train_loss']:.3f} | {r['final_val_text_loss']:.3f} | {r['final_val_chat_loss']:.3f} "
            f"| {r['train_seconds']} |")
    add("")
    add("Command (on one GPU; the corpus from `tools/fetch_default_corpus.sh`):\n")
    add(f"```\n{env['command']}\n```\n")
    add(f"- Device: {env['device']}; torch {env['torch']}, transformers {env['transformers']}, "
        f"tokenizers {env['tokenizers']}.")
    add(f"- Wall time: {timing['train']:.0f} s training (all runs), {timing['total']:.0f} s for the whole script "
        f"(data, tokenizer, training, saving, fixture, samples).")
    add(f"- Final losses (nats/token, kept weights, the same evaluation for each): train "
        f"{result['final_train_loss']:.3f} (64 random training windows), validation text "
        f"{result['final_val_text_loss']:.3f}, validation chat {result['final_val_chat_loss']:.3f}.\n")
    add(f"The shipped run, step by step (train loss: mean of the last 20 steps):\n")
    add("| step | train loss | val text | val chat | lr | seconds |")
    add("|---:|---:|---:|---:|---:|---:|")
    for r in h:
        add(f"| {r['step']} | {r['train_loss']:.3f} | {r['val_text_loss']:.3f} | {r['val_chat_loss']:.3f} "
            f"| {r['lr']:.2e} | {r['seconds']} |")
    add("")
    add("Determinism: everything random is seeded; cuBLAS runs with `CUBLAS_WORKSPACE_CONFIG=:4096:8`, "
        "TF32 is off, attention is transformers' eager path and `torch.use_deterministic_algorithms(True)` "
        "is on (warn-only). " + (
            "Ops that warned they have no deterministic implementation: " + "; ".join(
                f"`{w}`" for w in env["nondeterministic"]) + "." if env["nondeterministic"] else
            "No op warned that it is nondeterministic in this run.") +
        " A rerun on another GPU model or library version may still differ in the last bits, and "
        "training stops early if it runs past its time budget (it did "
        f"{'' if any(r['stopped_by_time'] for r in result['sweep']) else 'not '}in this run), "
        "so a slower machine trains fewer steps.\n")
    add("## Samples\n")
    add("Produced by transformers in the same run from the saved weights (float32 compute); sampled ones "
        f"with temperature 0.8, top-p 0.95, torch seed {args.seed}; at most 80 new tokens.\n")
    for s in sample_list:
        shown = s["prompt"] if s["kind"] == "text" else f"user: {s['prompt']}"
        add(f"**{s['name']}** — `{shown}`\n")
        add("> " + (s["prompt"] + s["output"] if s["kind"] == "text" else s["output"]).replace("\n", "\n> ") + "\n")
    add("## Golden fixture\n")
    add("`tests/fixtures/default_model/greedy.json` holds, for " + ", ".join(
        f"`{c['name']}`" for c in fixture["cases"]) +
        f": the prompt ids (HF tokenizer), the {fixture['n_new_tokens']} greedy next ids from transformers "
        "(float32 compute on these bf16 weights), their text, and the top-1/top-2 logit margin at each step; "
        "and the float32 logits at the last prompt position of the first case.\n")
    add("## License\n")
    add("The training text is public domain. The weights and tokenizer are made by this project and "
        "are under the project's license.")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


# ---------------------------------------------------------------- main

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--corpus", default=".carry/corpus/kjv_verses.txt")
    p.add_argument("--out", default="models/default")
    p.add_argument("--fixture", default="tests/fixtures/default_model/greedy.json")
    p.add_argument("--seed", type=int, default=1611)
    p.add_argument("--val-fraction", type=float, default=0.03)
    p.add_argument("--chat-convs", type=int, default=2500)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--intermediate", type=int, default=768)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--epochs", type=lambda v: [float(x) for x in v.split(",")], default=[5, 10, 20],
                   help="comma-separated run lengths in epochs; the best on validation is kept")
    p.add_argument("--max-steps", type=int, default=0, help="cap on steps (0: as the epochs say)")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--time-budget", type=float, default=240,
                   help="seconds of training (all runs together) before it stops")
    p.add_argument("--fixture-tokens", type=int, default=32)
    p.add_argument("--prepare-only", action="store_true", help="data preparation only (no torch)")
    return p.parse_args(argv)


def main(argv):
    args = parse_args(argv)
    t0 = time.time()
    data = prepare_data(args)
    data["seed"] = args.seed
    print("data:", json.dumps(data["stats"]))
    if args.prepare_only:
        for conv in data["train_chat"][:6]:
            print("----\n" + conv, end="")
        return 0

    # Before CUDA starts: cuBLAS needs a fixed workspace to be deterministic.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import warnings
    import tokenizers
    import torch
    import transformers
    from transformers import AutoTokenizer

    tok = train_tokenizer(data, args.vocab)
    deterministic_tok = train_tokenizer(data, args.vocab).to_str() == tok.to_str()
    streams = encode_streams(tok, data)
    tok_stats = {"vocab": tok.get_vocab_size(), "deterministic": deterministic_tok,
                 "train_tokens": len(streams["train"]), "train_chat_tokens": streams["train_chat_tokens"],
                 "val_text_tokens": len(streams["val_text"]), "val_chat_tokens": len(streams["val_chat"])}
    print("tokenizer:", json.dumps(tok_stats), f"({time.time() - t0:.1f}s)")

    # A few run lengths, each its own cosine schedule from the same seed; the one with the
    # lowest held-out text loss is kept (the data is small, so the right length is found,
    # not guessed). All runs together stop at the time budget.
    deadline = time.time() + args.time_budget
    model, result, sweep = None, None, []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for epochs in args.epochs:
            m, r = train_model(args, streams, tok.get_vocab_size(), epochs, deadline)
            sweep.append({k: r[k] for k in ("epochs", "steps_planned", "steps_done", "kept_step",
                                             "stopped_by_time", "train_seconds", "final_train_loss",
                                             "final_val_text_loss", "final_val_chat_loss")})
            if result is None or r["final_val_text_loss"] < result["final_val_text_loss"]:
                model, result = m, r
            else:
                del m
            torch.cuda.empty_cache()
    result["sweep"] = sweep
    result["train_seconds"] = round(sum(x["train_seconds"] for x in sweep), 1)
    print(f"kept the {result['epochs']}-epoch run: val_text {result['final_val_text_loss']:.4f}")
    nondet = sorted({str(w.message).split("\n")[0][:160] for w in caught
                     if "deterministic" in str(w.message)})
    for w in nondet:
        print("nondeterministic:", w)

    os.makedirs(args.out, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(args.out, safe_serialization=True)
    write_generation_config(args.out)
    save_tokenizer(tok, args.out, args.context)
    hf = AutoTokenizer.from_pretrained(args.out)
    check_tokenizer_folder(hf, tok, chat_renderer())
    del model
    torch.cuda.empty_cache()

    fixture = greedy_fixture(args.out, args.fixture, args.fixture_tokens)
    for c in fixture["cases"]:
        print(f"fixture {c['name']}: min margin {c['min_margin']:.4f}: {c['greedy_text']!r}")
    sample_list = samples(args.out, args.seed)
    t_total = time.time() - t0
    env = {
        "command": "PYTHONUNBUFFERED=1 python3 " + " ".join(shlex.quote(a) for a in [sys.argv[0]] + argv),
        "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
        "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
        "nondeterministic": nondet,
        "safetensors_bytes": os.path.getsize(os.path.join(args.out, "model.safetensors")),
    }
    write_model_card(os.path.join(args.out, "MODEL_CARD.md"), args, data["stats"], tok_stats, result,
                     fixture, sample_list, {"train": result["train_seconds"], "total": t_total}, env)
    with open(os.path.join(args.out, "config.json"), encoding="utf-8") as f:
        print("config.json:", f.read())
    print(f"done in {t_total:.1f}s; folder {args.out}:",
          {n: os.path.getsize(os.path.join(args.out, n)) for n in sorted(os.listdir(args.out))})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
