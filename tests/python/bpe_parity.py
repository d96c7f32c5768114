"""Hugging Face tokenizers' side of the BPE parity test (tests/data/test_bpe.cpp, Bpe.*HuggingFace*), on the
tokenizers wheel in .deps/python (scripts/install-python-test-deps.sh).

    bpe_parity.py TOKENIZER_JSON TEXTS_JSON
        Loads TOKENIZER_JSON with tokenizers.Tokenizer.from_file and prints, as one JSON list, the ids of each text
        of TEXTS_JSON (a JSON list of strings), in order.
"""
import json
import sys

from tokenizers import Tokenizer

if len(sys.argv) != 3:
    sys.exit("usage: bpe_parity.py TOKENIZER_JSON TEXTS_JSON")
tok = Tokenizer.from_file(sys.argv[1])
with open(sys.argv[2], encoding="utf-8") as f:
    texts = json.load(f)
print(json.dumps([tok.encode(t, add_special_tokens=False).ids for t in texts]))
