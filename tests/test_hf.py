"""Hugging Face interop: export, import, init_from, fill-mask and inspect-model against transformers."""

from __future__ import annotations

import dataclasses
import os
import pickle
import re
import shutil

from pathlib import Path

import pytest
import torch

from bertrain import rundir
from bertrain.config import Config, DataConfig, ModelConfig, dump_yaml, load_config
from bertrain.errors import BertrainError, ConfigError
from bertrain.model import build_model, save_weights
from bertrain.model import hf
from bertrain.model.fill_mask import fill_mask
from bertrain.model.hf import export_hf, hf_config, import_hf, initialize_from
from bertrain.model.hf_verify import padded_batch, verify_export
from bertrain.train.checkpoint import begin_save, finish_save
from tests.helpers import assert_rounding_close

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

SPECIALS = {"wordpiece": ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
            "unigram": ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"]}


def build_tokenizer(kind: str, text: str, out_dir) -> int:
    """A small WordPiece or Unigram tokenizer (special ids pad=0 … mask=4) saved with transformers'
    wrapper files; returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    specials = SPECIALS[kind]
    if kind == "wordpiece":
        tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=400, special_tokens=specials)
    else:
        tokenizer = Tokenizer(models.Unigram())
        tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation(), pre_tokenizers.Digits(),
             pre_tokenizers.Metaspace()])
        tokenizer.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=400, special_tokens=specials, unk_token="<unk>")
    tokenizer.train_from_iterator(text.splitlines(), trainer)
    assert [tokenizer.token_to_id(t) for t in specials] == [0, 1, 2, 3, 4]
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    wrapped = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token=specials[0], unk_token=specials[1], cls_token="[CLS]",
        sep_token="[SEP]", mask_token="[MASK]", model_input_names=["input_ids", "token_type_ids", "attention_mask"])
    wrapped.save_pretrained(out_dir)
    return tokenizer.get_vocab_size()


def tiny_config(kind: str, vocab: int) -> ModelConfig:
    if kind == "albert":
        return ModelConfig(type="albert", vocab_size=vocab, embedding_size=16, hidden_size=32, num_hidden_layers=2,
                           num_hidden_groups=2, inner_group_num=2, num_attention_heads=4, intermediate_size=64,
                           max_position_embeddings=64, hidden_act="gelu_new")
    return ModelConfig(type="bert", vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=64, max_position_embeddings=64)


def spread_(model, seed: int) -> None:
    """Larger random weights than the initialization, so top-k predictions are well separated."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.3)


@pytest.fixture(scope="module", params=["bert", "albert"])
def exported(request, tmp_path_factory, pydoc_text):
    """(kind, model, tokenizer dir, export dir, run dir) for a tiny random model with its tokenizer."""
    kind = request.param
    root = tmp_path_factory.mktemp(kind)
    vocab = build_tokenizer("wordpiece" if kind == "bert" else "unigram", pydoc_text[:300_000],
                            root / "run" / "tokenizer")
    torch.manual_seed(0)
    model = build_model(tiny_config(kind, vocab))
    spread_(model, seed=1)
    model.eval()
    # A RUN_DIR as the trainer writes it: an older complete checkpoint and a newer interrupted one.
    config = Config(data=DataConfig(max_seq_length=64), model=model.config)
    for step, complete in ((5, True), (10, False)):
        write_checkpoint(root / "run", step, model if complete else build_model(model.config), config, complete)
    export_hf(model, root / "hf", tokenizer_dir=root / "run" / "tokenizer")
    return kind, model, root / "run" / "tokenizer", root / "hf", root / "run"


def write_checkpoint(run_dir, step, model, config, complete: bool) -> None:
    """A checkpoint as the trainer writes it (its atomic save), or one killed before COMPLETE."""
    directory = begin_save(run_dir, step)
    save_weights(model, directory / "model.safetensors")
    (directory / "config.yaml").write_text(dump_yaml(config))
    if complete:
        finish_save(directory)
    else:
        directory.rename(run_dir / "checkpoints" / f"step-{step:08d}")  # as if killed before COMPLETE


TEXTS = ["the [MASK] statement is used to define a function.", "a [MASK] of objects, 42 in all."]


def rounding(model) -> dict:
    """rounding_rtol's K and steps between bertrain and transformers: the vocabulary's softmax, each layer carrying
    the earlier ones' rounding (about 1e-5 of the largest value, as in tests/test_model.py)."""
    return dict(reduction_length=model.config.vocab_size, steps=model.config.num_hidden_layers)


def test_export_loads_in_transformers_auto_classes(exported):
    kind, model, _, hf_dir, _ = exported
    config = transformers.AutoConfig.from_pretrained(hf_dir)
    assert config.model_type == kind and config.architectures == [f"{kind.capitalize()}ForPreTraining"]
    heads = {"bert": ("cls.", "bert.pooler."), "albert": ("predictions.", "sop_classifier.", "albert.pooler")}[kind]
    for auto in (transformers.AutoModelForPreTraining, transformers.AutoModelForMaskedLM,
                 transformers.AutoModelForSequenceClassification, transformers.AutoModel):
        loaded, info = transformers.AutoModelForPreTraining.from_pretrained(hf_dir, output_loading_info=True) \
            if auto is transformers.AutoModelForPreTraining else auto.from_pretrained(hf_dir, output_loading_info=True)
        expected_missing = {"classifier.weight", "classifier.bias"} \
            if auto is transformers.AutoModelForSequenceClassification else set()
        assert set(info["missing_keys"]) == expected_missing, (auto, info)
        assert not info["mismatched_keys"] and not info["error_msgs"]
        # Only the pretraining heads this class has no use for are left over (as with Google's checkpoints).
        assert all(key.startswith(heads) for key in info["unexpected_keys"]), (auto, info)
        if auto is transformers.AutoModelForPreTraining:
            assert not info["unexpected_keys"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
    assert tokenizer.mask_token == "[MASK]" and tokenizer.mask_token_id == 4 and tokenizer.pad_token_id == 0
    # The tied decoder is left out of the file, as transformers does.
    from safetensors import safe_open

    with safe_open(str(hf_dir / "model.safetensors"), "pt") as handle:
        assert not [k for k in handle.keys() if "decoder" in k]


@pytest.mark.cross_path
def test_fill_mask_equals_the_transformers_pipeline(exported):
    kind, model, tokenizer_dir, hf_dir, _ = exported
    pipe = transformers.pipeline("fill-mask", model=str(hf_dir), tokenizer=str(hf_dir), device="cpu")
    for text in TEXTS:
        theirs = pipe(text, top_k=5)
        for source in (model, import_hf(hf_dir)[0]):
            ours = fill_mask(source, hf_dir, text, top_k=5)
            assert [r["token"] for r in ours] == [r["token"] for r in theirs]
            assert [r["token_str"] for r in ours] == [r["token_str"] for r in theirs]
            assert [r["sequence"] for r in ours] == [r["sequence"] for r in theirs]
            assert_rounding_close([r["score"] for r in ours], [r["score"] for r in theirs], **rounding(model))


def test_export_and_fill_mask_do_not_repeat_the_runs_config_warnings(exported, tmp_path, run_cli, monkeypatch):
    """A finished run's config warnings (e.g. warmup longer than the run) were said when it trained."""
    import warnings

    from bertrain.config import ConfigWarning, load

    validate = load.validate

    def warning_validate(config):
        validate(config)
        warnings.warn("optim.warmup_steps is longer than the run", ConfigWarning)

    monkeypatch.setattr(load, "validate", warning_validate)
    _, _, _, _, run_dir = exported
    for args in (("export", str(run_dir), str(tmp_path / "out")), ("fill-mask", str(run_dir), TEXTS[0])):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            code, out, err = run_cli(*args)
        assert code == 0, err
        assert not [w for w in caught if issubclass(w.category, ConfigWarning)] and "warmup" not in err, args
    with pytest.warns(ConfigWarning, match="warmup"):  # the patch itself works: a config loaded to train warns
        load.load_config("tiny_bert")


@pytest.mark.cross_path
def test_export_of_a_run_dir_takes_the_newest_complete_checkpoint(exported, tmp_path, run_cli):
    kind, model, _, _, run_dir = exported
    code, out, err = run_cli("export", str(run_dir), str(tmp_path / "out"))
    assert code == 0, err
    assert "step-00000005" in out and "tokenizer.json" in out
    # The newer checkpoint passed over is named, with why (never a silent fallback).
    assert "Skipping invalid checkpoint" in err and "step-00000010" in err and "COMPLETE" in err
    theirs = transformers.AutoModelForPreTraining.from_pretrained(tmp_path / "out").eval()
    ids = torch.tensor([[2, 7, 4, 9, 11, 3]])
    with torch.no_grad():
        reference = theirs(input_ids=ids).prediction_logits
        ours = model(ids).mlm_logits
    assert_rounding_close(ours, reference, **rounding(model))
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "out").mask_token_id == 4


def test_fill_mask_command_on_a_run_dir_and_a_checkpoint(exported, run_cli):
    kind, model, tokenizer_dir, _, run_dir = exported
    expected = fill_mask(model, tokenizer_dir, TEXTS[0], top_k=3)
    for target in (run_dir, run_dir / "checkpoints" / "step-00000005"):
        code, out, err = run_cli("fill-mask", str(target), TEXTS[0], "--top-k", "3")
        assert code == 0, err
        for row in expected:
            assert f"{row['score']:.4f}" in out
    code, out, err = run_cli("fill-mask", str(run_dir / "checkpoints" / "step-00000010"), TEXTS[0])
    assert code == 1 and "COMPLETE" in err
    code, out, err = run_cli("fill-mask", str(run_dir), "no mask here")
    assert code == 2 and "[MASK]" in err


def test_init_from_a_transformers_dir_and_a_checkpoint(exported, tmp_path):
    kind, model, _, hf_dir, run_dir = exported
    ids = torch.tensor([[2, 7, 4, 9, 11, 3, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0]])
    with torch.no_grad():
        expected = model(ids, mask).mlm_logits
    for source in (hf_dir, run_dir, run_dir / "checkpoints" / "step-00000005"):
        fresh = build_model(model.config).eval()
        description = initialize_from(fresh, source)
        assert str(source) in description
        with torch.no_grad():
            assert torch.equal(fresh(ids, mask).mlm_logits, expected)  # the same weights through the same code
    wrong = build_model(dataclasses.replace(model.config, hidden_size=64, num_attention_heads=4))
    with pytest.raises(ConfigError, match="hidden_size"):
        initialize_from(wrong, hf_dir)


def test_init_from_sharded_safetensors_and_a_pytorch_model_bin_reads_the_same_weights(exported, tmp_path):
    # Larger hub models are sharded (model.safetensors.index.json), older ones have only pytorch_model.bin.
    kind, model, _, hf_dir, _ = exported
    twin = transformers.AutoModelForPreTraining.from_pretrained(hf_dir)
    twin.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert len(list((tmp_path / "sharded").glob("model-*-of-*.safetensors"))) > 1
    (tmp_path / "bin").mkdir()
    shutil.copy(hf_dir / "config.json", tmp_path / "bin")
    torch.save(twin.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    for source in (tmp_path / "sharded", tmp_path / "bin"):
        fresh = build_model(model.config)
        initialize_from(fresh, source)
        assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values()))


@pytest.mark.cross_path
def test_init_from_an_encoder_only_checkpoint_keeps_fresh_heads(tmp_path):
    config = tiny_config("bert", 120)
    values = {k: v for k, v in hf_config(config).items() if k != "model_type"}
    encoder = transformers.BertModel(transformers.BertConfig(**values), add_pooling_layer=False).eval()
    encoder.save_pretrained(tmp_path)
    model = build_model(config).eval()
    head_before = model.mlm_head.dense.weight.clone()
    description = initialize_from(model, tmp_path)
    assert "pooler.weight" in description and "mlm_head.dense.weight" in description
    assert torch.equal(model.mlm_head.dense.weight, head_before)
    ids = torch.tensor([[2, 5, 6, 7, 3]])
    with torch.no_grad():
        assert_rounding_close(model.encode(ids, None, torch.zeros_like(ids)), encoder(input_ids=ids).last_hidden_state,
                              config.intermediate_size, config.num_hidden_layers)  # the longest sum: the FFN's


@pytest.mark.parametrize("name", ["bert_base", "bert_large", "albert_base", "albert_large"])
def test_inspect_model_total_equals_transformers_count(run_cli, name):
    code, out, err = run_cli("inspect-model", name)
    assert code == 0, err
    total = int(re.search(r"Total parameters: ([\d,]+)", out).group(1).replace(",", ""))
    config = load_config(name).model
    config = dataclasses.replace(config, vocab_size=30000 if config.type == "albert" else 30522)
    values = {k: v for k, v in hf_config(config).items() if k != "model_type"}
    config_cls = transformers.AlbertConfig if config.type == "albert" else transformers.BertConfig
    model_cls = transformers.AlbertForPreTraining if config.type == "albert" else transformers.BertForPreTraining
    with torch.device("meta"):  # parameter shapes only
        reference = model_cls(config_cls(**values))
    assert total == reference.num_parameters() == sum(p.numel() for p in reference.parameters())
    published = {"bert_base": "110M", "bert_large": "340M", "albert_base": "12M", "albert_large": "18M"}[name]
    assert "published" in out and published in out and "vocabulary tokens" not in out
    code, out, _ = run_cli("inspect-model", name, "--vocab-size", "1000")
    # The paper's count is for its vocabulary: said beside another one (a Chinese or a demo tokenizer).
    assert f"{published} with {config.vocab_size:,} vocabulary tokens, not 1,000" in " ".join(out.split())
    smaller = int(re.search(r"Total parameters: ([\d,]+)", out).group(1).replace(",", ""))
    embedding = config.embedding_size if config.type == "albert" else config.hidden_size
    assert total - smaller == (config.vocab_size - 1000) * (embedding + 1)  # embedding rows + MLM bias


def test_load_for_inference_refuses_a_dir_that_is_not_a_model(tmp_path, run_cli):
    code, out, err = run_cli("fill-mask", str(tmp_path), "a [MASK]")
    assert code == 2 and "neither a checkpoint" in " ".join(err.split())
    code, out, err = run_cli("export", str(tmp_path / "missing"), str(tmp_path / "out"))
    assert code == 2 and "does not exist" in " ".join(err.split())


def test_export_of_a_run_dir_with_no_checkpoint_yet_says_so(exported, tmp_path, run_cli):
    kind, model, tokenizer_dir, _, _ = exported
    run_dir = tmp_path / "run"  # as a run leaves it before its first save: lock, config, tokenizer, metrics
    shutil.copytree(tokenizer_dir, run_dir / "tokenizer")
    (run_dir / ".lock").write_text("pid 1 on host since then\n")
    (run_dir / "config.yaml").write_text(dump_yaml(Config(data=DataConfig(max_seq_length=64), model=model.config)))
    for extra in (None, "metrics.jsonl", "checkpoints"):
        if extra == "metrics.jsonl":
            (run_dir / ".lock").unlink()
            (run_dir / extra).write_text("")
        elif extra == "checkpoints":
            (run_dir / extra).mkdir()
        code, out, err = run_cli("export", str(run_dir), str(tmp_path / "out"))
        text = " ".join(err.split())
        assert code == 1, (extra, out, err)
        assert f"RUN_DIR {run_dir} has no checkpoint yet: the run has saved none so far" in text
        assert "not a RUN_DIR" not in text and "neither" not in text
    assert not (tmp_path / "out").exists()


def test_export_fits_the_model_positions_and_honours_the_umask(exported, tmp_path):
    kind, model, tokenizer_dir, _, _ = exported
    positions = model.config.max_position_embeddings
    old_umask = os.umask(0o022)
    try:
        export_hf(model, tmp_path / "out", tokenizer_dir=tokenizer_dir)
        os.umask(0o027)
        export_hf(model, tmp_path / "private", tokenizer_dir=tokenizer_dir)
    finally:
        os.umask(old_umask)
    for out, mode in ((tmp_path / "out", 0o644), (tmp_path / "private", 0o640)):
        modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
        assert "model.safetensors" in modes and "tokenizer_config.json" in modes
        assert set(modes.values()) == {mode}, modes
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    assert tokenizer.model_max_length == positions
    text = " ".join(TEXTS * positions).replace("[MASK]", "word")  # longer than the model
    batch = tokenizer(text, truncation=True, return_tensors="pt")
    assert batch["input_ids"].shape[1] == positions
    auto = transformers.AutoModel.from_pretrained(tmp_path / "out").eval()
    pretraining = transformers.AutoModelForPreTraining.from_pretrained(tmp_path / "out").eval()
    with torch.no_grad():
        assert auto(**batch).last_hidden_state.shape[1] == positions
        theirs = pretraining(**batch).prediction_logits
        ours = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).mlm_logits
    assert_rounding_close(ours, theirs, **rounding(model))
    pipe = transformers.pipeline("fill-mask", model=str(tmp_path / "out"), tokenizer=str(tmp_path / "out"),
                                 device="cpu")
    assert len(pipe(f"{TEXTS[0]} {text}", top_k=2, tokenizer_kwargs={"truncation": True})) == 2


def test_export_and_fill_mask_of_a_run_dir_with_no_valid_checkpoint_exit_1_naming_each(exported, tmp_path, run_cli):
    kind, model, _, _, run_dir = exported
    broken = tmp_path / "run"
    shutil.copytree(run_dir, broken)
    tampered = broken / "checkpoints" / "step-00000005"
    (tampered / "COMPLETE").write_text("0" * 64 + "\n")
    for args in (("export", str(broken), str(tmp_path / "out")), ("fill-mask", str(broken), TEXTS[0])):
        code, out, err = run_cli(*args)
        assert code == 1, (args, out, err)
        lines = err.splitlines()
        assert f"RUN_DIR {broken} has 2 checkpoint(s) but none is valid:" in lines[0]
        assert f"  {tampered}: checksums.json does not match the COMPLETE marker" in lines
        assert f"  {broken}/checkpoints/step-00000010: no COMPLETE marker (the save did not finish)" in lines
        assert "--resume PATH" in err and "new run dir" in err
    assert not (tmp_path / "out").exists()


def test_export_and_fill_mask_never_unpickle_a_checkpoint(exported, tmp_path, run_cli, monkeypatch):
    """An old-format checkpoint carrying a pickle payload: export and fill-mask read only the weights."""
    kind, model, tokenizer_dir, _, _ = exported
    run_dir, ran = tmp_path / "run", tmp_path / "payload-ran"
    shutil.copytree(tokenizer_dir, run_dir / "tokenizer")

    class Payload:
        def __reduce__(self):
            return os.system, (f"touch {ran}",)

    directory = begin_save(run_dir, 3)
    save_weights(model, directory / "model.safetensors")
    (directory / "config.yaml").write_text(dump_yaml(Config(data=DataConfig(max_seq_length=64), model=model.config)))
    (directory / "scheduler.pt").write_bytes(pickle.dumps({"scheduler": Payload()}))
    checkpoint = finish_save(directory)
    assert rundir.legacy_pickle_files(checkpoint) == [checkpoint / "scheduler.pt"]

    def refuse(*args, **kwargs):
        raise AssertionError("torch.load called")

    monkeypatch.setattr(torch, "load", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    code, _, err = run_cli("export", str(run_dir), str(tmp_path / "out"))
    assert code == 0, err
    code, _, err = run_cli("fill-mask", str(checkpoint), TEXTS[0])
    assert code == 0, err
    assert not ran.exists()
    for source in ("model/hf.py", "model/hf_verify.py", "model/fill_mask.py", "model/from_checkpoint.py",
                   "model/__init__.py", "rundir.py"):
        assert "weights_only=False" not in (Path(rundir.__file__).parent / source).read_text()


def test_export_verify_compares_logits_with_transformers_on_a_padded_batch(exported, tmp_path, run_cli):
    kind, model, _, hf_dir, run_dir = exported
    code, out, err = run_cli("export", str(run_dir), str(tmp_path / "out"), "--verify")
    assert code == 0, err
    line = " ".join(out.split())
    assert "PASS" in line and "tolerance 1e-04" in line
    assert f"a long text truncated to {model.config.max_position_embeddings} tokens" in line
    mlm, sentence = (float(x) for x in re.search(r"MLM logits (\S+) .*sentence logits (\S+);", line).groups())
    assert 0 <= mlm <= 1e-4 and 0 <= sentence <= 1e-4
    # The batch pads one row and gives the other two segments; the API reports the same figures.
    batch = padded_batch(hf_dir, model.config.vocab_size, model.config.max_position_embeddings, pad_id=0)
    lengths = batch["attention_mask"].sum(1).tolist()
    assert lengths[0] < lengths[1] == batch["input_ids"].shape[1] and batch["token_type_ids"][1].max() == 1
    assert (batch["input_ids"][0, lengths[0]:] == 0).all()
    check = verify_export(model, hf_dir)
    assert check.passed and check.padded_tokens == lengths[1] - lengths[0] and check.real_tokens == sum(lengths)


def test_export_verify_fails_when_transformers_reads_other_logits(exported, tmp_path, run_cli, monkeypatch):
    kind, model, _, _, run_dir = exported
    faithful = hf.to_hf_state_dict

    def skewed(model):
        state = faithful(model)
        name = next(k for k in state if k.endswith(("attention.output.dense.weight", "attention.dense.weight")))
        # Random, not uniform: a uniform shift would be removed by the LayerNorm that follows.
        state[name] = state[name] + 1e-2 * torch.randn(state[name].shape, generator=torch.Generator().manual_seed(0))
        return state

    monkeypatch.setattr(hf, "to_hf_state_dict", skewed)
    code, out, err = run_cli("export", str(run_dir), str(tmp_path / "out"), "--verify")
    assert code == 1 and "FAIL" in out and "FAILED" in err, out


def test_export_verify_without_transformers_exits_1_and_says_why(exported, tmp_path, run_cli, monkeypatch):
    kind, model, _, _, run_dir = exported
    monkeypatch.setitem(__import__("sys").modules, "transformers", None)  # import transformers → ImportError
    code, out, err = run_cli("export", str(run_dir), str(tmp_path / "out"), "--verify")
    assert code == 1 and "needs transformers" in err and "not verified" in " ".join(err.split())
    assert (tmp_path / "out" / "model.safetensors").is_file()
    with pytest.raises(BertrainError, match="needs transformers"):
        verify_export(model, tmp_path / "out")
