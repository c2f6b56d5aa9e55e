#!/usr/bin/env python3
"""Generates hearth's golden fixture for Gemma-4's vision tower with transformers.

OUT/gemma4_vision-f32/: a tiny random-weight Gemma4ForConditionalGeneration saved in
float32 (a 2-layer e-style text stack — a sliding and a full layer, per-layer inputs,
bidirectional attention over images on the sliding layer — and a 2-layer vision tower:
patch embedding with a learned 2-D position table, axial 2-D RoPE, q/k/v norms,
clipped linears with finite ranges, 3x3 average pooling by position, standardization,
and the embedder into the text space), made into a whole model folder: a byte-level
tokenizer (tests/fixtures/serve's, plus Gemma-4's media and turn markers as special
tokens), Gemma 4's chat template and the processor's config.

Inputs (written into the folder): img_a.png (40x30: upscaled by the processor),
img_b.png (200x90: downscaled), img_a.jpg (img_a saved by PIL as JPEG, quality 90) and
img_a_jpg.rgb (PIL's decode of that JPEG, RGB8); for the decoders' tests img_a.webp
(lossless), img_a.gif with img_a_gif.rgb (PIL's decode) and anim.gif (3 frames, 200 ms
each) with anim.<k>.rgb.

References (little-endian arrays named in golden.json with shape and dtype):
  the image processors exactly: <img>.resized (u8, H x W x 3: PIL's bicubic resize),
  img_a.pixel_values (the valid patches, f32, Gemma4ImageProcessorPil), <img>.pixel_values_tv
  (Gemma4ImageProcessor, torchvision's resize on uint8 and a float32 rescale: what
  AutoProcessor loads for the saved folder), <img>.position_ids (i32, x y per patch),
  <img>.num_soft_tokens;
  the tower in float64 on the pixels of the folder's own processor (reference_pixels):
  <img>.soft_tokens (after pooling, standardization and the embedder: what enters the text
  model);
  prompts through the folder's processor (AutoProcessor.from_pretrained: its chat template
  renders the image parts, placeholders expanded, tokenized as apply_chat_template does),
  the text, ids and mm_token_type_ids, and the float64 logits at the positions listed in
  logits_rows (every fifth and the last 16, to keep the fixture small), plus a greedy
  continuation (p_img: one image; p_two: img_b then img_a; p_jpg: the JPEG's pixels as PIL
  decoded them).

Usage: python3 tools/gen_mm_golden.py OUT [SERVE_TOKENIZER_DIR] [GEMMA4_TEMPLATE]
(needs torch, torchvision, transformers, PIL)
"""
import json
import math
import os
import shutil
import sys
import traceback

import numpy as np
import torch
import transformers

BASE_VOCAB = 512
SPECIALS = ["<|image|>", "<|image>", "<image|>", "<|audio|>", "<|audio>", "<audio|>", "<|video|>", "<|turn>",
            "<turn|>"]
IMAGE, BOI, EOI, AUDIO, BOA, EOA, VIDEO = 512, 513, 514, 515, 516, 517, 518
VOCAB = 528
TEXT = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0, rms_norm_eps=1e-6,
            num_hidden_layers=2, head_dim=16, global_head_dim=32, sliding_window=8,
            layer_types=["sliding_attention", "full_attention"], hidden_size_per_layer_input=8,
            vocab_size_per_layer_input=VOCAB, final_logit_softcapping=30.0,
            use_bidirectional_attention="vision")
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=2, head_dim=16, patch_size=4, pooling_kernel_size=3, position_embedding_size=48,
              use_clipped_linears=True, standardize=True, rms_norm_eps=1e-6,
              rope_parameters=dict(rope_type="axial", rope_theta=100.0))
PROC = dict(patch_size=4, pooling_kernel_size=3, max_soft_tokens=70)
GREEDY = 8


class Dumper:
    def __init__(self, folder):
        self.folder = folder
        self.doc = {"transformers_version": transformers.__version__, "torch_version": torch.__version__,
                    "arrays": {}}

    def arr(self, name, a, dtype="<f4"):
        if isinstance(a, torch.Tensor):
            a = a.detach().cpu()
            a = a.to(torch.float64).numpy() if a.is_floating_point() else a.numpy()
        a = np.asarray(a)
        fn = name + {"<f4": ".f32", "<i4": ".i32", "u1": ".u8"}[dtype]
        a.astype(dtype).tofile(os.path.join(self.folder, fn))
        self.doc["arrays"][name] = {"file": fn, "shape": list(a.shape), "dtype": dtype}
        print(f"  {name}: {list(a.shape)} {dtype}", flush=True)
        self.write()

    def set(self, key, value):
        self.doc[key] = value
        self.write()

    def write(self):
        with open(os.path.join(self.folder, "golden.json"), "w") as f:
            json.dump(self.doc, f, indent=1)
            f.write("\n")


def make_image(rng, w, h):
    """A gradient with a disc and pixel noise: smooth areas, an edge and noise for the resize."""
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.zeros((h, w, 3), np.float64)
    img[..., 0] = 255.0 * xx / max(w - 1, 1)
    img[..., 1] = 255.0 * yy / max(h - 1, 1)
    img[..., 2] = 128.0 + 100.0 * np.sin(xx * 0.7) * np.cos(yy * 0.5)
    disc = (xx - w * 0.6) ** 2 + (yy - h * 0.4) ** 2 < (min(w, h) * 0.3) ** 2
    img[disc] = [250.0, 30.0, 60.0]
    img += rng.normal(0.0, 18.0, img.shape)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def make_tokenizer(folder, serve_dir):
    """tests/fixtures/serve's byte-level BPE (512 tokens) plus Gemma-4's markers as special tokens 512..520."""
    with open(os.path.join(serve_dir, "tokenizer.json")) as f:
        tj = json.load(f)
    for i, s in enumerate(SPECIALS):
        tj["added_tokens"].append({"id": BASE_VOCAB + i, "content": s, "single_word": False, "lstrip": False,
                                   "rstrip": False, "normalized": False, "special": True})
    path = os.path.join(folder, "tokenizer.json")
    with open(path, "w") as f:
        json.dump(tj, f, ensure_ascii=False)
    from transformers import PreTrainedTokenizerFast
    tok = PreTrainedTokenizerFast(tokenizer_file=path, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                  pad_token="<unk>",
                                  extra_special_tokens={"image_token": "<|image|>", "boi_token": "<|image>",
                                                        "eoi_token": "<image|>", "audio_token": "<|audio|>",
                                                        "boa_token": "<|audio>", "eoa_token": "<audio|>"})
    for name, want in (("image_token_id", IMAGE), ("boi_token", "<|image>"), ("eoi_token", "<image|>")):
        got = getattr(tok, name, None)
        print(f"tokenizer.{name} = {got!r}", flush=True)
        assert got == want, (name, got, want)
    return tok


def init(model, seed):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gen_golden
    gen_golden.init_weights(model, True, seed, 0.3)
    g = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not any(k in name for k in ("vision_tower.", "embed_vision.")):
                continue
            r = torch.randn(p.shape, generator=g, dtype=torch.float64)
            if name.endswith("position_embedding_table"):
                p.copy_(r * 0.5)
            elif "norm" in name and p.dim() == 1:
                p.copy_(1.0 + r * 0.1)
            else:
                p.copy_(r / math.sqrt(p.shape[-1]))
        for name, b in model.named_buffers():
            u = float(torch.rand((), generator=g))
            if name.endswith(("input_min", "output_min")):
                b.fill_(-(1.5 + 2.0 * u))
            elif name.endswith(("input_max", "output_max")):
                b.fill_(1.5 + 2.0 * u)
            elif name.endswith("std_bias"):
                b.copy_(torch.randn(b.shape, generator=g, dtype=torch.float64) * 0.5)
            elif name.endswith("std_scale"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g, dtype=torch.float64))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/mm"
    serve_dir = sys.argv[2] if len(sys.argv) > 2 else "tests/fixtures/serve"
    tmpl_path = sys.argv[3] if len(sys.argv) > 3 else "tests/fixtures/templates/gemma4/chat_template.jinja"
    from PIL import Image
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil
    folder = os.path.join(out, "gemma4_vision-f32")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    seed = 51
    cfg = transformers.Gemma4Config(text_config=dict(TEXT), vision_config=dict(VISION), audio_config=None,
                                    image_token_id=IMAGE, boi_token_id=BOI, eoi_token_id=EOI, audio_token_id=AUDIO,
                                    boa_token_id=BOA, eoa_token_index=EOA, video_token_id=VIDEO, bos_token_id=1,
                                    eos_token_id=2, pad_token_id=0, tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = transformers.Gemma4ForConditionalGeneration._from_config(cfg, attn_implementation="eager")
    init(model, seed)
    model.to(torch.float32).save_pretrained(folder)
    d = Dumper(folder)
    d.set("model", "Gemma4ForConditionalGeneration")
    d.set("reference", "float64 forward (eager attention) on the stored float32 weights; pixels by the PIL image "
                       "processor (Gemma4ImageProcessorPil)")
    d.set("processor", PROC)
    d.set("token_ids", dict(image=IMAGE, boi=BOI, eoi=EOI, audio=AUDIO, boa=BOA, eoa=EOA, video=VIDEO, pad=0,
                            bos=1, eos=2))
    d.set("num_parameters", int(model.num_parameters()))

    tok = make_tokenizer(folder, serve_dir)
    with open(tmpl_path) as f:
        template = f.read()
    ip = Gemma4ImageProcessorPil(**PROC)
    proc = None
    try:
        from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
        from transformers.models.gemma4.processing_gemma4 import Gemma4Processor
        from transformers.models.gemma4.video_processing_gemma4 import Gemma4VideoProcessor
        proc = Gemma4Processor(feature_extractor=Gemma4AudioFeatureExtractor(), image_processor=ip, tokenizer=tok,
                               video_processor=Gemma4VideoProcessor(), chat_template=template)
        proc.save_pretrained(folder)
    except Exception:
        print(traceback.format_exc(), flush=True)
        tok.save_pretrained(folder)
        ip.save_pretrained(folder)
        with open(os.path.join(folder, "chat_template.jinja"), "w") as f:
            f.write(template)
    ip_tv = None
    try:
        from transformers.models.gemma4.image_processing_gemma4 import Gemma4ImageProcessor
        ip_tv = Gemma4ImageProcessor(**PROC)
    except Exception:
        print(traceback.format_exc(), flush=True)

    # what users get: the processor as the folder loads it
    try:
        proc = transformers.AutoProcessor.from_pretrained(folder)
    except Exception:
        print(traceback.format_exc(), flush=True)
    ref_ip = proc.image_processor if proc is not None else ip
    print(f"folder processor: {type(proc).__name__}, image processor {type(ref_ip).__name__}", flush=True)
    d.set("reference_pixels", "pil" if type(ref_ip).__name__.endswith("Pil") else "torchvision")
    rng = np.random.default_rng(seed)
    images = {"img_a": make_image(rng, 40, 30), "img_b": make_image(rng, 200, 90)}
    for name, img in images.items():
        Image.fromarray(img).save(os.path.join(folder, name + ".png"))
        img.tofile(os.path.join(folder, name + ".rgb"))
    # the other formats the decoders read: lossless WebP (the same pixels), GIF (a palette: PIL's
    # decode kept), an animated GIF of 3 frames (a video through FFmpeg; PIL's frames kept)
    Image.fromarray(images["img_a"]).save(os.path.join(folder, "img_a.webp"), lossless=True)
    Image.fromarray(images["img_a"]).save(os.path.join(folder, "img_a.gif"))
    np.asarray(Image.open(os.path.join(folder, "img_a.gif")).convert("RGB")).tofile(os.path.join(folder, "img_a_gif.rgb"))
    frames = [Image.fromarray(np.roll(images["img_a"], 7 * k, axis=1)) for k in range(3)]
    frames[0].save(os.path.join(folder, "anim.gif"), save_all=True, append_images=frames[1:], duration=200, loop=0)
    with Image.open(os.path.join(folder, "anim.gif")) as an:
        for k in range(3):
            an.seek(k)
            np.asarray(an.convert("RGB")).tofile(os.path.join(folder, f"anim.{k}.rgb"))
    Image.fromarray(images["img_a"]).save(os.path.join(folder, "img_a.jpg"), quality=90)
    jpg = np.asarray(Image.open(os.path.join(folder, "img_a.jpg")).convert("RGB"))
    jpg.tofile(os.path.join(folder, "img_a_jpg.rgb"))
    images["img_a_jpg"] = jpg
    d.set("images", {k: {"w": int(v.shape[1]), "h": int(v.shape[0])} for k, v in images.items()})

    m = transformers.Gemma4ForConditionalGeneration.from_pretrained(folder, dtype=torch.float64,
                                                                    attn_implementation="eager")
    m.eval()
    feats = {}
    for name, img in images.items():
        pil = Image.open(os.path.join(folder, name + ".png")) if name != "img_a_jpg" else Image.fromarray(img)
        try:
            from transformers.models.gemma4.image_processing_pil_gemma4 import get_aspect_ratio_preserving_size
            th, tw = get_aspect_ratio_preserving_size(img.shape[0], img.shape[1], PROC["patch_size"],
                                                      PROC["max_soft_tokens"] * PROC["pooling_kernel_size"] ** 2,
                                                      PROC["pooling_kernel_size"])
            rs = np.asarray(pil.convert("RGB").resize((tw, th), Image.BICUBIC))
            d.arr(name + ".resized", rs, "u1")
        except Exception:
            print(traceback.format_exc(), flush=True)
        bf = ip(pil, return_tensors="np")
        pv, pos, n_soft = bf["pixel_values"][0], bf["image_position_ids"][0], int(bf["num_soft_tokens_per_image"][0])
        valid = (pos != -1).all(-1)
        if name == "img_a":  # (PIL's pixels for one image: the others' resized images cover PIL's resize)
            d.arr(name + ".pixel_values", pv[valid])
        d.arr(name + ".position_ids", pos[valid].astype(np.int32), "<i4")
        d.set(name + ".num_soft_tokens", n_soft)
        feats[name] = (bf, n_soft)
        if ip_tv is not None:
            try:
                bt = ip_tv(pil, return_tensors="pt")
                pt = bt["pixel_values"][0].numpy()
                d.arr(name + ".pixel_values_tv", pt[valid])
                d.set(name + ".tv_equals_pil", bool(np.array_equal(pt[valid], pv[valid])))
                d.set(name + ".tv_max_diff", float(np.abs(pt[valid].astype(np.float64) - pv[valid]).max()))
            except Exception:
                print(traceback.format_exc(), flush=True)
        try:
            rb = ref_ip(pil, return_tensors="pt")
            with torch.no_grad():
                vo = m.model.vision_tower(pixel_values=rb["pixel_values"], pixel_position_ids=rb["image_position_ids"].long(),
                                          return_dict=True)
                st = m.model.embed_vision(inputs_embeds=vo.last_hidden_state)
            d.arr(name + ".soft_tokens", st)
        except Exception:
            print(traceback.format_exc(), flush=True)

    prompts = {}
    specs = {
        "p_img": [("img_a", "What is in this picture?")],
        "p_two": [("img_b", "Compare this"), ("img_a", "with this one.")],
        "p_jpg": [("img_a_jpg", "What is in this picture?")],
    }
    for pname, parts in specs.items():
        try:
            content = []
            pil_images = []
            for img_name, text in parts:
                content.append({"type": "image"})
                content.append({"type": "text", "text": text})
                pil_images.append(Image.fromarray(images[img_name]))
            messages = [{"role": "user", "content": content}]
            if proc is None:
                raise RuntimeError("no processor")
            text = proc.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            for c, im in zip([c for c in content if c["type"] == "image"], pil_images):
                c["image"] = im
            inputs = proc.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True,
                                              return_tensors="pt")
            ids = inputs["input_ids"][0].tolist()
            tt = inputs.get("mm_token_type_ids")
            kw = dict(input_ids=inputs["input_ids"], pixel_values=inputs["pixel_values"].double(),
                      image_position_ids=inputs["image_position_ids"])
            if tt is not None:
                kw["mm_token_type_ids"] = tt
            with torch.no_grad():
                logits = m(**kw).logits[0]
                cur, tts, greedy, gaps = list(ids), (tt[0].tolist() if tt is not None else None), [], []
                for _ in range(GREEDY):
                    k2 = dict(kw)
                    k2["input_ids"] = torch.tensor([cur])
                    if tts is not None:
                        k2["mm_token_type_ids"] = torch.tensor([tts])
                    last = m(**k2).logits[0, -1]
                    top = torch.topk(last, 2)
                    gaps.append(float(top.values[0] - top.values[1]))
                    cur.append(int(top.indices[0]))
                    if tts is not None:
                        tts.append(0)
                    greedy.append(int(top.indices[0]))
            keep = [i for i in range(len(ids)) if i % 5 == 0 or i >= len(ids) - 16]
            d.arr(pname + ".logits", logits[keep])
            entry = {"images": [p[0] for p in parts], "texts": [p[1] for p in parts], "text": text, "ids": ids,
                     "logits_rows": keep,
                     "mm_token_type_ids": tt[0].tolist() if tt is not None else None, "greedy": greedy,
                     "top2_gaps": gaps, "max_abs_logit": float(logits.abs().max())}
            prompts[pname] = entry
            d.set("prompts", prompts)
            print(f"{pname}: {len(ids)} tokens max|logit| {entry['max_abs_logit']:.3f} greedy {greedy} "
                  f"min gap {min(gaps):.4g}", flush=True)
        except Exception:
            print(f"{pname}: " + traceback.format_exc(), flush=True)
    # the same prompt with the image's bidirectional span switched off (every layer causal)
    try:
        e = prompts["p_img"]
        with torch.no_grad():
            rb = ref_ip(Image.fromarray(images["img_a"]), return_tensors="pt")
            logits = m(input_ids=torch.tensor([e["ids"]]), pixel_values=rb["pixel_values"].double(),
                       image_position_ids=rb["image_position_ids"].long()).logits[0]
        d.arr("p_img.logits_causal", logits[e["logits_rows"]])
    except Exception:
        print(traceback.format_exc(), flush=True)
    d.write()
    total = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
    print(f"folder bytes: {total}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
