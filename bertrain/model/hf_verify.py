"""`bertrain export --verify`: compare an export's logits under transformers with ours on one padded batch
(a text and a longer pair), then on a text longer than the model that transformers' tokenizer truncates;
MLM logits at real tokens only (transformers' logits at padding are meaningless)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bertrain.errors import BertrainError, DataError
from bertrain.model import unwrap
from bertrain.tokenizer_file import load_tokenizer

VERIFY_TOLERANCE = 1e-4  # fp32: the two implementations differ only in summation order
TEXTS = ("the model reads this sentence.",
         "a second, longer segment follows it, so that the two rows of the batch differ in length.")


@dataclass
class ExportCheck:
    """Max absolute differences between our logits and transformers' on the same padded batch."""

    mlm_max_diff: float
    sentence_max_diff: float
    tolerance: float
    real_tokens: int
    padded_tokens: int
    truncated_tokens: int = 0  # the long text's length after the exported tokenizer's truncation (0: no tokenizer)
    loading_problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        differences = (self.mlm_max_diff, self.sentence_max_diff)
        return not self.loading_problems and all(d <= self.tolerance for d in differences)  # NaN fails

    def summary(self) -> str:
        """One line: both differences, the batch, the tolerance and PASS/FAIL."""
        problems = f"; transformers reported {'; '.join(self.loading_problems)}" if self.loading_problems else ""
        truncated = f"; a long text truncated to {self.truncated_tokens} tokens" if self.truncated_tokens else ""
        return (f"max |ours - transformers|: MLM logits {self.mlm_max_diff:.2e} ({self.real_tokens} real tokens, "
                f"{self.padded_tokens} padding{truncated}), sentence logits {self.sentence_max_diff:.2e}; tolerance "
                f"{self.tolerance:.0e}{problems}: {'PASS' if self.passed else 'FAIL'}")


def padded_batch(export_dir: Path, vocab_size: int, max_positions: int, pad_id: int) -> dict[str, torch.Tensor]:
    """input_ids, attention_mask, token_type_ids [2, T] from the exported tokenizer (fixed random ids
    when the export has none): a short single text, then a longer pair; the short row is padded."""
    if (export_dir / "tokenizer.json").is_file():
        tokenizer = load_tokenizer(export_dir)
        tokenizer.no_padding()
        tokenizer.no_truncation()
        rows = [(e.ids, e.type_ids) for e in (tokenizer.encode(TEXTS[0]), tokenizer.encode(*TEXTS))]
    else:
        ids = torch.randint(0, vocab_size, (24,), generator=torch.Generator().manual_seed(0)).tolist()
        rows = [(ids[:9], [0] * 9), (ids, [0] * 12 + [1] * 12)]
    short = min(len(rows[0][0]), max(1, max_positions // 2))
    long = min(len(rows[1][0]), max_positions)
    rows = [(rows[0][0][:short], rows[0][1][:short]), (rows[1][0][:long], rows[1][1][:long])]
    if max(max(ids) for ids, _ in rows) >= vocab_size:
        raise DataError(f"The tokenizer in {export_dir} produces ids beyond the model's vocab_size ({vocab_size}): "
                        "export with the tokenizer the model was trained with (--tokenizer).")
    width = max(len(ids) for ids, _ in rows)
    batch = {"input_ids": torch.full((2, width), pad_id), "attention_mask": torch.zeros(2, width, dtype=torch.long),
             "token_type_ids": torch.zeros(2, width, dtype=torch.long)}
    for row, (ids, types) in enumerate(rows):
        batch["input_ids"][row, :len(ids)] = torch.tensor(ids)
        batch["attention_mask"][row, :len(ids)] = 1
        batch["token_type_ids"][row, :len(ids)] = torch.tensor(types)
    return batch


def load_with_transformers(export_dir: Path):
    """(transformers' *ForPreTraining model in eval mode, what its loader reported as wrong)."""
    try:
        import transformers  # optional and heavy: only --verify needs it
    except ImportError:
        raise BertrainError(f"export --verify needs transformers (pip install transformers). The export in "
                            f"{export_dir} was written but not verified.") from None
    kind = json.loads((export_dir / "config.json").read_text(encoding="utf-8"))["model_type"]
    model_class = transformers.AlbertForPreTraining if kind == "albert" else transformers.BertForPreTraining
    model, info = model_class.from_pretrained(export_dir, output_loading_info=True)
    problems = [f"{what} {sorted(map(str, info[what]))[:3]}" for what in ("missing_keys", "unexpected_keys",
                                                                         "mismatched_keys", "error_msgs")
                if info.get(what)]
    return model.float().eval(), problems


def truncated_batch(export_dir: Path, max_positions: int) -> dict[str, torch.Tensor] | None:
    """A text longer than the model through transformers' load of the exported tokenizer, truncation=True."""
    if not (export_dir / "tokenizer.json").is_file():
        return None
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(export_dir)
    return dict(tokenizer(" ".join(TEXTS * (max_positions // 8 + 2)), truncation=True, return_tensors="pt"))


@torch.no_grad()
def verify_export(model, export_dir: str | Path, tolerance: float = VERIFY_TOLERANCE) -> ExportCheck:
    """Run our model and transformers' load of `export_dir` on one padded batch and compare the logits."""
    export_dir = Path(export_dir)
    ours = unwrap(model).float().eval()
    theirs, problems = load_with_transformers(export_dir)
    pad_id = theirs.config.pad_token_id if theirs.config.pad_token_id is not None else 0
    batch = padded_batch(export_dir, ours.config.vocab_size, ours.config.max_position_embeddings, pad_id)
    real = batch["attention_mask"].bool()
    our_output = ours(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    their_output = theirs(**batch)
    their_sentence = their_output.sop_logits if ours.config.type == "albert" else their_output.seq_relationship_logits
    mlm = (our_output.mlm_logits.float()[real] - their_output.prediction_logits.float()[real]).abs().max()
    sentence = (our_output.sentence_logits.float() - their_sentence.float()).abs().max()
    long = truncated_batch(export_dir, ours.config.max_position_embeddings)
    if long is not None:
        try:  # a tokenizer that keeps more tokens than the model has positions makes both models fail here
            long_ours = ours(long["input_ids"], long.get("attention_mask"), long.get("token_type_ids")).mlm_logits
            mlm = torch.maximum(mlm, (long_ours.float() - theirs(**long).prediction_logits.float()).abs().max())
        except (RuntimeError, IndexError, ValueError) as error:
            problems.append(f"a text of {long['input_ids'].shape[1]} tokens after truncation fails: {error}")
    return ExportCheck(mlm_max_diff=float(mlm), sentence_max_diff=float(sentence), tolerance=tolerance,
                       real_tokens=int(real.sum()), padded_tokens=int((~real).sum()), loading_problems=problems,
                       truncated_tokens=0 if long is None else long["input_ids"].shape[1])
