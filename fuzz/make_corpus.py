#!/usr/bin/env python3
"""Write the seed corpus of the fuzz targets into fuzz/corpus/<target>/ (Note [fuzz targets] in
fuzz/CMakeLists.txt): a few small valid inputs of each reader and near-valid ones (truncated, a count or offset
off by one, a wrong type), so that libFuzzer starts inside the formats instead of guessing magic numbers.
Deterministic; run it after changing a reader's format or a target's input layout, and commit the result."""
import gzip
import json
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(target, name, data):
    folder = os.path.join(ROOT, target)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def gz(data):
    return gzip.compress(data, mtime=0)


# ---- safetensors: u64 LE header length, JSON header, data ----
def safetensors(entries, metadata=None, pad=True, data=None):
    header, blob = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in entries:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(raw)]}
        blob += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + (blob if data is None else data)


f32 = struct.pack("<6f", 1, 2, 3, 4, 5, 6)
i64 = struct.pack("<2q", 7, -8)
put("fuzz_safetensors", "two_tensors", safetensors([("w", "F32", [2, 3], f32), ("step", "I64", [2], i64)],
                                                   {"format": "mixprec-checkpoint-1", "config": "{}"}))
put("fuzz_safetensors", "all_dtypes", safetensors([
    ("a", "F64", [1], struct.pack("<d", 0.5)), ("b", "F16", [2], b"\x00\x3c\x00\xc0"),
    ("c", "BF16", [2], b"\x80\x3f\x00\x40"), ("d", "I32", [], struct.pack("<i", 3)),
    ("e", "U8", [3], b"\x01\x02\x03"), ("f", "BOOL", [2, 1], b"\x00\x02")]))
put("fuzz_safetensors", "empty_header", safetensors([]))
put("fuzz_safetensors", "zero_size_dim", safetensors([("z", "F32", [0, 4], b""), ("s", "F32", [1], f32[:4])]))
put("fuzz_safetensors", "truncated_data", safetensors([("w", "F32", [2, 3], f32)], data=f32[:20]))
# A shape without elements whose strides overflow int64 (refused; was undefined behaviour in empty()).
put("fuzz_safetensors", "zero_dim_huge_strides", safetensors([("z", "F32", [0, 2 ** 62, 4], b"")]))
# Nesting deeper than a header's 3 levels (refused as the parser descends: Note [quoting untrusted JSON]).
deep = b'{"__metadata__":{"k":' + b"[" * 40 + b"]" * 40 + b"}}"
put("fuzz_safetensors", "deep_nesting", struct.pack("<Q", len(deep)) + deep)
put("fuzz_safetensors", "offsets_overlap",
    struct.pack("<Q", 88) + b'{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},'
                              b'"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}'.ljust(88) + b"abc")

# ---- IDX: first byte B = the image file's share of the rest, (B * rest) // 255 bytes ----
def idx_pair(images, labels, n_img=None, n_lab=None, h=2, w=2):
    img = struct.pack(">IIII", 0x803, len(labels) if n_img is None else n_img, h, w) + images
    lab = struct.pack(">II", 0x801, len(labels) if n_lab is None else n_lab) + labels
    return img, lab


def idx_input(img, lab):
    rest = len(img) + len(lab)
    for b in range(256):  # the share byte that splits the input exactly at the end of the image file
        if (b * rest) // 255 == len(img):
            return bytes([b]) + img + lab
    raise ValueError("no share byte splits %d + %d bytes" % (len(img), len(lab)))


img, lab = idx_pair(bytes(range(12)), b"\x01\x09\x00")
put("fuzz_idx", "three_images", idx_input(img, lab))
put("fuzz_idx", "zero_images", idx_input(*idx_pair(b"", b"")))
put("fuzz_idx", "zero_images_huge_size", idx_input(*idx_pair(b"", b"", h=0xFFFFFFFF, w=0xFFFFFFFF)))
img2, lab2 = idx_pair(bytes(range(12)), b"\x01\x02\x03", n_lab=4)
put("fuzz_idx", "label_count_off", idx_input(img2, lab2))
img3, lab3 = idx_pair(bytes(range(12)), b"\x01\x0a\x00")
put("fuzz_idx", "label_out_of_range", idx_input(img3, lab3))

# ---- CIFAR: first byte even = CIFAR-10 (1 label byte), odd = CIFAR-100 (coarse, fine); records of 3072 pixels ----
pixels = bytes(i % 251 for i in range(3072))
put("fuzz_cifar", "cifar10_one_record", b"\x00" + b"\x03" + pixels)
put("fuzz_cifar", "cifar100_one_record", b"\x01" + b"\x02\x63" + pixels)
put("fuzz_cifar", "cifar10_gzip", b"\x00" + gz(b"\x09" + pixels))
put("fuzz_cifar", "cifar10_truncated", b"\x00" + b"\x03" + pixels[:100])

# ---- text corpora: first byte = options (bit 0 lowercase, bit 1 split punctuation, bits 2-7 max_vocab) ----
put("fuzz_text", "plain", b"\x00" + b"the cat sat on the mat\nthe dog <unk> ran\n\nA b c\n" * 3)
put("fuzz_text", "kjv_dump", b"\x03" + b"Genesis 1\n 1 In the beginning God created the heaven and the earth.\n"
    b" 2 And the earth was without form, and void; and darkness was upon the face of the deep.\n"
    b"1 Samuel 3\n 1 And the child Samuel ministered unto the LORD before Eli.\n")
put("fuzz_text", "max_vocab", b"\x0c" + b"a a a b b c d e f g\r\nh i j k l m n\n" * 2)
put("fuzz_text", "gzip", b"\x00" + gz(b"one two three\nfour five\n"))

# ---- JSONL run logs ----
put("fuzz_run_log", "train_log",
    '{"type":"step","epoch":1,"step":1,"loss":2.3,"lr":0.1,"scale":65536.0,"skipped":false}\n'
    '{"type":"step","epoch":1,"step":2,"loss":null,"lr":0.1,"scale":32768.0,"skipped":true}\n'
    '{"type":"epoch","epoch":1,"train_loss":2.1,"val_accuracy":0.45,"seconds":1.5}\n'
    '{"type":"step","epoch":2,"step":4,"loss":1.9,"lr":0.05,"scale":32768.0,"skipped":false}\n')
put("fuzz_run_log", "torn_last_line", '{"type":"step","step":1,"loss":2.3}\n{"type":"step","st')
put("fuzz_run_log", "not_an_object", '{"type":"step","step":1}\n[1,2]\n')
put("fuzz_run_log", "big_numbers", '{"step":18446744073709551615,"x":-9223372036854775808,"y":1e308}\n\n')

# ---- JSON configs (--config FILE.json: keys are the flag names) ----
put("fuzz_config", "small", json.dumps({"model": "mlp", "dataset": "fashion-mnist", "epochs": 2, "lr": 0.1,
                                        "precision": "bf16", "augment": False}, indent=2))
put("fuzz_config", "wrong_type", '{"epochs": "two"}')
put("fuzz_config", "unknown_field", '{"epochs": 2, "epoch": 3}')
put("fuzz_config", "float_for_int", '{"epochs": 2.5, "batch_size": 1e3}')
put("fuzz_config", "huge_float_for_int", '{"epochs": 1e300}')
put("fuzz_config", "deep_nesting", '{"epochs": ' + "[" * 40 + "]" * 40 + "}")
put("fuzz_config", "int_beyond_int32", '{"num_workers": 4294967296, "seed": 18446744073709551615}')

# ---- the kernel-path cache (identity as in fuzz_kernel_path_cache.cpp) ----
identity = {"format": 1, "cpu": "fuzz", "threads": 2, "onednn": "3.2.0 fuzz", "mixprec": "0.1.0"}
paths = {"matmul bf16 64x64x64": {"path": "onednn", "ms": {"onednn": 0.12, "packed": 0.3}},
         "conv bf16 1x3x8x8": {"path": "im2col", "ms": {"im2col": 0.5}}}
put("fuzz_kernel_path_cache", "two_entries", json.dumps({"machine": identity, "paths": paths}, indent=1))
put("fuzz_kernel_path_cache", "foreign_machine", json.dumps({"machine": dict(identity, threads=8), "paths": paths}))
put("fuzz_kernel_path_cache", "deep_machine", json.dumps({"machine": {"format": [[[[[[[[1]]]]]]]]}, "paths": {}}))
put("fuzz_kernel_path_cache", "entry_without_ms", json.dumps({"machine": identity, "paths": {"k": {"path": "x"}}}))

# ---- byte-level BPE tokenizers (first byte even: a tokenizer.json; odd: text for a fixed tokenizer) ----
def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


byte_syms = bytes_to_unicode()
vocab = {"<|endoftext|>": 0}
for s_ in byte_syms:
    vocab[s_] = len(vocab)
vocab["th"], vocab["the"] = len(vocab), len(vocab) + 1
tok = {"version": "1.0", "added_tokens": [{"id": 0, "content": "<|endoftext|>", "special": True}],
       "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False},
       "model": {"type": "BPE", "vocab": vocab, "merges": ["t h", ["th", "e"]]}}
put("fuzz_tokenizer", "small", b"\x00" + json.dumps(tok).encode())
put("fuzz_tokenizer", "merge_of_unknown", b"\x00" + json.dumps(dict(tok, model=dict(tok["model"], merges=["q z"]))).encode())
put("fuzz_tokenizer", "wordpiece", b"\x00" + json.dumps({"model": {"type": "WordPiece", "vocab": {}}}).encode())
put("fuzz_tokenizer", "text", b"\x01the cat's hat <|endoftext|> 123\n\n  x")
put("fuzz_tokenizer", "bad_utf8", b"\x01ok \xff\xfe \xc3")

