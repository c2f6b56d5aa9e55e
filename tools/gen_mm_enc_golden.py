#!/usr/bin/env python3
"""Generates hearth's golden fixtures for the media encoders with transformers.

Two tiny random-weight multimodal models, saved in float32, and their references
computed in float64 on the stored weights (eager attention):

OUT/qwen3_5_vision-f32/   Qwen3_5ForConditionalGeneration: a 2-layer hybrid text stack
    (Gated DeltaNet + gated full attention, M-RoPE interleaved over 3 axes) and a 2-block
    vision tower (Conv3d patch embedding, bilinear learned positions, 2-D rotary, patch merger).
    Inputs: img_a (29x21), img_b (60x80, shrunk by max_pixels), video_a (4 frames), video_b
    (3 frames: the last repeated to fill the temporal patch), as PNG and raw RGB8 (H, W, 3).
    References: the image / video processors' output (resized uint8 images, patches, grids),
    the tower's hidden states (after the patch embedding + positions, after each block) and
    merged output, the 3-axis position ids of prompts with an image, two images, video
    frames, and their logits at every position (plus a greedy continuation of the image prompt).

OUT/gemma4_audio-f32/     Gemma4ForConditionalGeneration with an audio tower only (references in float32: its attention does not
    run in float64; the tower's mask built under sdpa, golden.json's audio_attn_implementation): a
    3-layer e-style text stack (per-layer inputs, shared KV) and a 2-layer conformer audio
    encoder (two stride-2 Conv2d + LayerNorm subsampling, chunked local attention with
    relative positions and softcap, light conv, macaron feed-forwards, clipped linears with
    finite ranges), with its multimodal embedder.
    Inputs: clip_a (1.19 s) and clip_b (0.3 s), 16 kHz mono, as 16-bit WAV and f32 PCM (the
    WAV's samples / 32768). References: log-mel features and frame mask (the default
    extractor, and one with preemphasis, FFT overdrive and an input scale), the subsampling
    output, each layer's output, the tower's output, the embedder's soft tokens, and the
    logits of a prompt holding clip_a.

Every array is a little-endian file named in golden.json with its shape and dtype.

Usage: python3 tools/gen_mm_enc_golden.py OUT   (needs torch, torchvision, transformers, PIL)
"""
import json
import math
import os
import shutil
import sys
import traceback
import wave

import numpy as np
import torch
import transformers

VOCAB = 512
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2,
              pad_token_id=0, rms_norm_eps=1e-6)
# media token ids inside the tiny vocabulary
Q_IMAGE, Q_VIDEO, Q_VSTART, Q_VEND = 500, 501, 502, 503
G_IMAGE, G_AUDIO, G_VIDEO, G_BOI, G_EOI, G_BOA, G_EOA = 500, 501, 502, 503, 504, 505, 506


class Dumper:
    def __init__(self, folder):
        self.folder = folder
        self.doc = {"transformers_version": transformers.__version__, "torch_version": torch.__version__,
                    "numpy_version": np.__version__, "arrays": {}}

    def arr(self, name, a, dtype="<f4"):
        if isinstance(a, torch.Tensor):
            a = a.detach().cpu()
            a = a.to(torch.float64).numpy() if a.is_floating_point() else a.numpy()
        a = np.asarray(a)
        dtype = "u1" if dtype == "u8" else dtype
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


def init_params(model, seed, text_init):
    """Text parameters as tools/gen_golden.py initialises them (text_init); the media towers'
    by fan-in: matrices and convolutions r / sqrt(fan_in), LayerNorm / RMSNorm weights 1 + 0.1 r,
    biases 0.1 r."""
    text_init(model, seed)
    g = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not any(k in name for k in ("visual.", "audio_tower.", "embed_audio.")):
                continue
            r = torch.randn(p.shape, generator=g, dtype=torch.float64)
            if name.endswith("per_dim_scale"):
                p.copy_(r * 0.5)
            elif "norm" in name and name.endswith("weight") and p.dim() == 1:
                p.copy_(1.0 + r * 0.1)
            elif name.endswith("bias"):
                p.copy_(r * 0.1)
            elif p.dim() == 1:
                p.copy_(1.0 + r * 0.1)
            else:
                fan_in = int(np.prod(p.shape[1:]))
                p.copy_(r / math.sqrt(fan_in))


def make_image(rng, w, h):
    """A gradient with a disc and noise: smooth areas, an edge and pixel noise for the resize."""
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.zeros((h, w, 3), np.float64)
    img[..., 0] = 255.0 * xx / max(w - 1, 1)
    img[..., 1] = 255.0 * yy / max(h - 1, 1)
    img[..., 2] = 128.0 + 100.0 * np.sin(xx * 0.7) * np.cos(yy * 0.5)
    disc = (xx - w * 0.6) ** 2 + (yy - h * 0.4) ** 2 < (min(w, h) * 0.3) ** 2
    img[disc] = [250.0, 30.0, 60.0]
    img += rng.normal(0.0, 18.0, img.shape)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def save_rgb(folder, name, img):
    from PIL import Image
    Image.fromarray(img).save(os.path.join(folder, name + ".png"))
    img.tofile(os.path.join(folder, name + ".rgb"))


def load_f64(cls, folder):
    m = cls.from_pretrained(folder, dtype=torch.float64, attn_implementation="eager")
    m.eval()
    return m


# ---------------------------------------------------------------- Qwen3.5 vision

Q_TEXT = dict(num_hidden_layers=2, head_dim=32, layer_types=["linear_attention", "full_attention"],
              linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
              linear_num_key_heads=2, linear_num_value_heads=2,
              rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5,
                                   mrope_section=[3, 3, 2], mrope_interleaved=True),
              tie_word_embeddings=False)
Q_VISION = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=4,
                spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16)
Q_PROC = dict(patch_size=4, merge_size=2, temporal_patch_size=2, image_mean=[0.5, 0.5, 0.5],
              image_std=[0.5, 0.5, 0.5])
Q_MIN_PIXELS, Q_MAX_PIXELS = 8 * 8 * 4, 8 * 8 * 64


def qwen_processors():
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
    ip = Qwen2VLImageProcessor(min_pixels=Q_MIN_PIXELS, max_pixels=Q_MAX_PIXELS, **Q_PROC)
    vp = Qwen3VLVideoProcessor(size={"shortest_edge": Q_MIN_PIXELS, "longest_edge": 4 * Q_MAX_PIXELS},
                               do_sample_frames=False, **Q_PROC)
    return ip, vp


def qwen_resized_images(ip, img):
    """The uint8 image after the processor's resize (the torchvision backend's resize on the
    uint8 tensor), plus the same resize done in float32 and rounded, to tell the paths apart."""
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize
    from torchvision.transforms.v2 import functional as tvF
    h, w = img.shape[:2]
    rh, rw = smart_resize(h, w, factor=8, min_pixels=Q_MIN_PIXELS, max_pixels=Q_MAX_PIXELS)
    t = torch.from_numpy(img).permute(2, 0, 1).contiguous()[None]
    u8 = tvF.resize(t, [rh, rw], interpolation=tvF.InterpolationMode.BICUBIC, antialias=True)[0]
    f = tvF.resize(t.float(), [rh, rw], interpolation=tvF.InterpolationMode.BICUBIC, antialias=True)[0]
    f64 = tvF.resize(t.double(), [rh, rw], interpolation=tvF.InterpolationMode.BICUBIC, antialias=True)[0]
    return (rh, rw), u8, f, f64


def gen_qwen(out, seed):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gen_golden
    folder = os.path.join(out, "qwen3_5_vision-f32")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    text = dict(COMMON)
    text.update(Q_TEXT)
    cfg = transformers.AutoConfig.for_model(
        "qwen3_5", text_config=text, vision_config=dict(Q_VISION), tie_word_embeddings=False, bos_token_id=1,
        eos_token_id=2, pad_token_id=0, image_token_id=Q_IMAGE, video_token_id=Q_VIDEO,
        vision_start_token_id=Q_VSTART, vision_end_token_id=Q_VEND)
    torch.manual_seed(seed)
    model = transformers.Qwen3_5ForConditionalGeneration._from_config(cfg, attn_implementation="eager")
    init_params(model, seed, lambda m, s: gen_golden.init_weights(m, False, s))
    model.to(torch.float32).save_pretrained(folder)
    d = Dumper(folder)
    d.set("model", "Qwen3_5ForConditionalGeneration")
    d.set("reference", "float64 forward (eager attention) on the stored float32 weights")
    d.set("processor", dict(Q_PROC, min_pixels=Q_MIN_PIXELS, max_pixels=Q_MAX_PIXELS,
                            video_longest_edge=4 * Q_MAX_PIXELS, resample="bicubic (torchvision, antialias)",
                            image_processor="Qwen2VLImageProcessor", video_processor="Qwen3VLVideoProcessor"))
    d.set("token_ids", dict(image=Q_IMAGE, video=Q_VIDEO, vision_start=Q_VSTART, vision_end=Q_VEND))
    m = load_f64(transformers.Qwen3_5ForConditionalGeneration, folder)
    ip, vp = qwen_processors()
    ip.save_pretrained(folder)
    vp.save_pretrained(folder)
    rng = np.random.default_rng(seed)
    try:  # the torchvision uint8 bicubic resize on pixel noise, up and down, for the resize itself
        import torchvision
        from torchvision.transforms.v2 import functional as tvF
        d.set("torchvision_version", torchvision.__version__)
        noise = torch.from_numpy(rng.integers(0, 256, size=(3, 13, 17), dtype=np.uint8))
        d.arr("resize_noise", noise, "u8")
        cases = [[24, 32], [8, 8], [40, 16], [13, 34], [5, 9]]
        d.set("resize_cases", cases)
        for hw in cases:
            d.arr(f"resize_noise.{hw[0]}x{hw[1]}",
                  tvF.resize(noise[None], hw, interpolation=tvF.InterpolationMode.BICUBIC, antialias=True)[0], "u8")
    except Exception:
        print(traceback.format_exc(), flush=True)
    images = {"img_a": make_image(rng, 29, 21), "img_b": make_image(rng, 60, 80)}
    grids = {}
    feats = {}
    for name, img in images.items():
        save_rgb(folder, name, img)
        d.set(name + ".hw", list(img.shape[:2]))
        try:
            (rh, rw), u8, f32r, f64r = qwen_resized_images(ip, img)
            d.arr(name + ".resized", u8, "u8")
            d.arr(name + ".resized_f32path", f32r)
            d.arr(name + ".resized_f64path", f64r)
            d.set(name + ".resized_hw", [rh, rw])
        except Exception:
            print(traceback.format_exc(), flush=True)
        from PIL import Image
        bf = ip(images=[Image.fromarray(img)], return_tensors="pt")
        pv, grid = bf["pixel_values"], bf["image_grid_thw"]
        d.arr(name + ".pixel_values", pv)
        d.set(name + ".grid_thw", grid[0].tolist())
        grids[name] = grid
        feats[name] = pv
        try:  # the PIL backend for comparison
            from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
            pp = Qwen2VLImageProcessorPil(min_pixels=Q_MIN_PIXELS, max_pixels=Q_MAX_PIXELS, **Q_PROC)
            d.arr(name + ".pixel_values_pil", pp(images=[Image.fromarray(img)],
                                                 return_tensors="pt")["pixel_values"])
        except Exception:
            print(traceback.format_exc(), flush=True)
    videos = {"video_a": [make_image(rng, 29, 21) for _ in range(4)],
              "video_b": [make_image(rng, 29, 21) for _ in range(3)]}
    for name, frames in videos.items():
        d.set(name + ".hw", list(frames[0].shape[:2]))
        d.set(name + ".frames", len(frames))
        for i, fr in enumerate(frames):
            save_rgb(folder, f"{name}.{i}", fr)
        arr = np.stack(frames)  # (T, H, W, 3)
        try:
            bf = vp(videos=[arr], return_tensors="pt", cap_pixels_per_frame=False)
            d.arr(name + ".pixel_values", bf["pixel_values_videos"])
            d.set(name + ".grid_thw", bf["video_grid_thw"][0].tolist())
            grids[name] = bf["video_grid_thw"]
            feats[name] = bf["pixel_values_videos"]
        except Exception:
            print(f"{name}: " + traceback.format_exc(), flush=True)
    # frame timestamps as the Qwen3-VL processor writes them (frames 0..3 at 2 fps)
    ts = [(i / 2.0 + (i + 1) / 2.0) / 2 for i in range(0, 4, 2)]
    d.set("video_a.timestamps_at_2fps", [f"<{t:.1f} seconds>" for t in ts])

    visual = m.model.visual
    for name in feats:
        pv, grid = feats[name].double(), grids[name]
        try:
            hs = []
            hooks = [b.register_forward_hook(lambda mod, a, o: hs.append(o)) for b in visual.blocks]
            pre = []
            hooks.append(visual.blocks[0].register_forward_pre_hook(lambda mod, a, kw: pre.append(a[0]),
                                                                    with_kwargs=True))
            with torch.no_grad():
                vo = visual(pv, grid_thw=grid, return_dict=True)
            for h in hooks:
                h.remove()
            d.arr(name + ".embed", pre[0])
            for i, h in enumerate(hs):
                d.arr(f"{name}.block{i}", h[0] if isinstance(h, tuple) else h)
            d.arr(name + ".tower", vo.pooler_output)
        except Exception:
            print(traceback.format_exc(), flush=True)

    # prompts: ids with placeholders, the 3-axis positions, logits at every position
    def tx(n):
        return [int(x) for x in rng.integers(3, 499, size=n)]

    def ntok(grid):
        return int(grid.prod()) // 4

    ga, gb = grids["img_a"][0], grids["img_b"][0]
    gv = grids["video_a"][0] if "video_a" in grids else torch.tensor([2, 6, 8])
    per_frame = int(gv[1] * gv[2]) // 4
    prompts = {
        "p_image": (tx(5) + [Q_VSTART] + [Q_IMAGE] * ntok(ga) + [Q_VEND] + tx(6), ["img_a"], []),
        "p_two_images": (tx(3) + [Q_VSTART] + [Q_IMAGE] * ntok(gb) + [Q_VEND] + tx(4) + [Q_VSTART]
                         + [Q_IMAGE] * ntok(ga) + [Q_VEND] + tx(3), ["img_b", "img_a"], []),
        "p_video": (tx(3) + tx(2) + [Q_VSTART] + [Q_VIDEO] * per_frame + [Q_VEND] + tx(2) + [Q_VSTART]
                    + [Q_VIDEO] * per_frame + [Q_VEND] + tx(4), [], ["video_a"]),
        "p_image_video": (tx(2) + [Q_VSTART] + [Q_IMAGE] * ntok(ga) + [Q_VEND] + tx(2) + [Q_VSTART]
                          + [Q_VIDEO] * per_frame + [Q_VEND] + tx(2) + [Q_VSTART] + [Q_VIDEO] * per_frame
                          + [Q_VEND] + tx(3), ["img_a"], ["video_a"]),
    }
    pdoc = {}
    for pname, (ids, imgs, vids) in prompts.items():
        if any(n not in feats for n in imgs + vids):
            continue
        try:
            input_ids = torch.tensor([ids])
            tt = torch.tensor([[1 if t == Q_IMAGE else 2 if t == Q_VIDEO else 0 for t in ids]])
            kw = dict(mm_token_type_ids=tt)
            if imgs:
                kw["pixel_values"] = torch.cat([feats[n] for n in imgs]).double()
                kw["image_grid_thw"] = torch.cat([grids[n] for n in imgs])
            if vids:
                kw["pixel_values_videos"] = torch.cat([feats[n] for n in vids]).double()
                kw["video_grid_thw"] = torch.cat([grids[n] for n in vids])
            with torch.no_grad():
                pos, delta = m.model.get_rope_index(input_ids, tt, image_grid_thw=kw.get("image_grid_thw"),
                                                    video_grid_thw=kw.get("video_grid_thw"))
                m.model.rope_deltas = None
                logits = m(input_ids=input_ids, **kw).logits[0]
            d.arr(pname + ".positions", pos[:, 0, :], "<i4")
            d.arr(pname + ".logits", logits)
            entry = {"ids": ids, "images": imgs, "videos": vids, "rope_delta": int(delta[0, 0]),
                     "max_abs_logit": float(logits.abs().max())}
            if pname == "p_image":
                cur, greedy, gaps = list(ids), [], []
                for _ in range(8):
                    t2 = torch.tensor([[1 if t == Q_IMAGE else 0 for t in cur]])
                    m.model.rope_deltas = None
                    with torch.no_grad():
                        last = m(input_ids=torch.tensor([cur]), mm_token_type_ids=t2,
                                 pixel_values=kw["pixel_values"], image_grid_thw=kw["image_grid_thw"]).logits[0, -1]
                    top = torch.topk(last, 2)
                    gaps.append(float(top.values[0] - top.values[1]))
                    greedy.append(int(top.indices[0]))
                    cur.append(greedy[-1])
                entry["greedy"] = {"ids": greedy, "top2_gaps": gaps, "min_gap": min(gaps)}
            pdoc[pname] = entry
            print(f"{pname}: {len(ids)} tokens, delta {int(delta[0, 0])}, max|logit| {entry['max_abs_logit']:.3f}",
                  flush=True)
        except Exception:
            print(f"{pname}: " + traceback.format_exc(), flush=True)
    d.set("prompts", pdoc)
    d.set("num_parameters", m.num_parameters())
    d.write()


# ---------------------------------------------------------------- Gemma-4 audio

G_TEXT = dict(num_hidden_layers=3, head_dim=16, global_head_dim=32, sliding_window=8, intermediate_size=64,
              layer_types=["sliding_attention", "full_attention", "sliding_attention"],
              hidden_size_per_layer_input=16, vocab_size_per_layer_input=VOCAB, num_kv_shared_layers=1,
              use_double_wide_mlp=True, final_logit_softcapping=30.0)
G_AUDIO_CFG = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, subsampling_conv_channels=[128, 8],
                   conv_kernel_size=5, attention_chunk_size=12, attention_context_left=13, attention_context_right=0,
                   attention_logit_cap=50.0, use_clipped_linears=True, output_proj_dims=48, rms_norm_eps=1e-6)


def make_clip(rng, n):
    """A chirp, a tone burst and noise at 16 kHz, quantized to 16 bits."""
    t = np.arange(n) / 16000.0
    x = 0.3 * np.sin(2 * np.pi * (200 * t + 900 * t * t))
    x += 0.2 * np.sin(2 * np.pi * 1200 * t) * (np.sin(2 * np.pi * 3 * t) > 0)
    x += 0.05 * rng.normal(size=n)
    q = np.clip(np.rint(x * 32768.0), -32768, 32767).astype(np.int16)
    return q


def save_clip(folder, name, q):
    with wave.open(os.path.join(folder, name + ".wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(q.astype("<i2").tobytes())
    pcm = q.astype(np.float32) / np.float32(32768.0)
    pcm.astype("<f4").tofile(os.path.join(folder, name + ".pcm"))
    return pcm


def gen_gemma(out, seed):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gen_golden
    from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
    folder = os.path.join(out, "gemma4_audio-f32")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    text = dict(COMMON)
    text.update(G_TEXT)
    cfg = transformers.Gemma4Config(text_config=text, audio_config=dict(G_AUDIO_CFG), vision_config=None,
                                    image_token_id=G_IMAGE, audio_token_id=G_AUDIO, video_token_id=G_VIDEO,
                                    boi_token_id=G_BOI, eoi_token_id=G_EOI, boa_token_id=G_BOA,
                                    eoa_token_index=G_EOA, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(seed)
    model = transformers.Gemma4ForConditionalGeneration._from_config(cfg, attn_implementation="eager")
    init_params(model, seed, lambda m, s: gen_golden.init_weights(m, True, s, 0.3))
    # finite clip ranges on the clippable linears (checkpoints carry them; inf would test nothing)
    g = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith(("input_min", "output_min")):
                b.fill_(-(1.0 + 2.0 * float(torch.rand((), generator=g))))
            elif name.endswith(("input_max", "output_max")):
                b.fill_(1.0 + 2.0 * float(torch.rand((), generator=g)))
    model.to(torch.float32).save_pretrained(folder)
    d = Dumper(folder)
    d.set("model", "Gemma4ForConditionalGeneration")
    d.set("reference", "float32 forward (eager attention in the text model, the audio tower's mask under sdpa; the "
                       "audio tower does not run in float64); features by the feature extractor (numpy) from the f32 PCM")
    d.set("token_ids", dict(audio=G_AUDIO, boa=G_BOA, eoa=G_EOA, image=G_IMAGE, video=G_VIDEO, boi=G_BOI,
                            eoi=G_EOI, pad=0))
    fe = Gemma4AudioFeatureExtractor()
    fe.save_pretrained(folder)
    fe_alt_kw = dict(preemphasis=0.97, preemphasis_htk_flavor=True, fft_overdrive=True, input_scale_factor=2.0,
                     mel_floor=1e-5, per_bin_mean=[0.01 * i for i in range(128)],
                     per_bin_stddev=[1.0 + 0.005 * i for i in range(128)])
    fe_alt = Gemma4AudioFeatureExtractor(**fe_alt_kw)
    fe_alt2 = Gemma4AudioFeatureExtractor(preemphasis=0.97, preemphasis_htk_flavor=False)
    d.set("feature_extractor_alt", fe_alt_kw)
    d.set("feature_extractor_alt2", dict(preemphasis=0.97, preemphasis_htk_flavor=False))
    # float32: the audio attention casts q / k / v to float32 (.float()) and multiplies them with float64
    # per-dimension scales in a float64 model, which torch refuses; the reference is the float32 forward.
    # The audio tower's mask is built under sdpa: Gemma4AudioAttention applies its mask as a boolean
    # (masked_fill(mask.logical_not(), ...)), which holds for the boolean mask create_bidirectional_mask
    # makes under sdpa (transformers' default) but inverts the additive float mask it makes under eager
    # (0 where a key is seen): under eager every frame would attend to exactly the keys it must not see
    # (huggingface/transformers#48818). The tower computes its attention by hand either way.
    m = transformers.Gemma4ForConditionalGeneration.from_pretrained(
        folder, dtype=torch.float32, attn_implementation={"": "eager", "text_config": "eager", "audio_config": "sdpa"})
    m.eval()
    if m.model.audio_tower.config._attn_implementation != "sdpa":
        raise RuntimeError("the audio tower's attention is %r, not sdpa" % m.model.audio_tower.config._attn_implementation)
    d.set("audio_attn_implementation", "sdpa")
    rng = np.random.default_rng(seed)
    clips = {"clip_a": save_clip(folder, "clip_a", make_clip(rng, 19000)),
             "clip_b": save_clip(folder, "clip_b", make_clip(rng, 4800))}
    soft = {}
    feats = {}
    for name, pcm in clips.items():
        bf = fe([pcm], return_tensors="np")  # a batch of one: a bare 1-D array is read as one sample per frame
        f, mask = bf["input_features"][0], bf["input_features_mask"][0]
        d.arr(name + ".features", f)
        d.arr(name + ".mask", mask.astype(np.int32), "<i4")
        feats[name] = (f, mask)
        for tag, ex in (("features_alt", fe_alt), ("features_alt2", fe_alt2)):
            try:
                b2 = ex([pcm], return_tensors="np")
                d.arr(f"{name}.{tag}", b2["input_features"][0])
                d.arr(f"{name}.{tag}_mask", b2["input_features_mask"][0].astype(np.int32), "<i4")
            except Exception:
                print(traceback.format_exc(), flush=True)
        tower = m.model.audio_tower
        try:
            x = torch.from_numpy(f)[None]
            mk = torch.from_numpy(mask)[None]
            hs = []
            hooks = [l.register_forward_hook(lambda mod, a, o: hs.append(o)) for l in tower.layers]
            sub = []
            hooks.append(tower.subsample_conv_projection.register_forward_hook(lambda mod, a, o: sub.append(o)))
            with torch.no_grad():
                ao = tower(x, mk, return_dict=True)
                st = m.model.embed_audio(inputs_embeds=ao.last_hidden_state)
            for h in hooks:
                h.remove()
            d.arr(name + ".subsample", sub[0][0][0])
            d.arr(name + ".subsample_mask", sub[0][1][0].to(torch.int32), "<i4")
            for i, h in enumerate(hs):
                d.arr(f"{name}.layer{i}", (h[0] if isinstance(h, tuple) else h)[0])
            d.arr(name + ".tower", ao.last_hidden_state[0])
            d.arr(name + ".tower_mask", ao.attention_mask[0].to(torch.int32), "<i4")
            d.arr(name + ".soft_tokens", st[0])
            valid = ao.attention_mask[0]
            soft[name] = int(valid.sum())
            d.set(name + ".num_soft_tokens", soft[name])
            d.set(name + ".samples", int(len(pcm)))
        except Exception:
            print(traceback.format_exc(), flush=True)
    try:
        from transformers.models.gemma4.processing_gemma4 import Gemma4Processor
        counts = {}
        for name, pcm in clips.items():
            counts[name] = Gemma4Processor._compute_audio_num_tokens(
                type("P", (), {"feature_extractor": fe, "audio_seq_length": 750})(), pcm, 16000)
        d.set("processor_audio_num_tokens", counts)
    except Exception:
        print(traceback.format_exc(), flush=True)

    def tx(n):
        return [int(x) for x in rng.integers(3, 499, size=n)]

    prompts = {}
    if "clip_a" in soft:
        ids = [1] + tx(5) + [G_BOA] + [G_AUDIO] * soft["clip_a"] + [G_EOA] + tx(6)
        f, mask = feats["clip_a"]
        try:
            with torch.no_grad():
                logits = m(input_ids=torch.tensor([ids]), input_features=torch.from_numpy(f)[None],
                           input_features_mask=torch.from_numpy(mask)[None]).logits[0]
            d.arr("p_audio.logits", logits)
            prompts["p_audio"] = {"ids": ids, "audio": ["clip_a"], "max_abs_logit": float(logits.abs().max())}
            print(f"p_audio: {len(ids)} tokens max|logit| {float(logits.abs().max()):.3f}", flush=True)
        except Exception:
            print(traceback.format_exc(), flush=True)
    d.set("prompts", prompts)
    d.set("num_parameters", m.num_parameters())
    d.write()


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/mm"
    only = [a[len("--only="):] for a in sys.argv[2:] if a.startswith("--only=")]
    os.makedirs(out, exist_ok=True)
    rc = 0
    for name, fn, seed in (("qwen", gen_qwen, 41), ("gemma", gen_gemma, 42)):
        if only and name not in only[0].split(","):
            continue
        try:
            fn(out, seed)
        except Exception:
            print(f"{name}: " + traceback.format_exc(), flush=True)
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
