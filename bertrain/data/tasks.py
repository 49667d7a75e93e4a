"""Fine-tuning tasks for `bertrain evaluate`: GLUE (from a local folder in GLUE's own layout, or the hub through
`datasets`) and tasks of the user's own from a YAML file. A task knows its columns, labels, metrics and recipe."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from bertrain.config import read_yaml
from bertrain.config.finetune import TaskFile, finetune_config
from bertrain.config.yaml_tree import build_dataclass
from bertrain.data.sources.hub import hub_offline, hub_reachable
from bertrain.data.task_files import Examples, float_label, label_lookup, label_names, read_examples
from bertrain.errors import ConfigError, DataError

GLUE_HUB_NAME = "nyu-mll/glue"
GLUE_HELP = ("Download GLUE (e.g. with the download_glue_data.py script of the GLUE baselines) and pass its folder "
             "as --glue-dir (it holds CoLA/, SST-2/, MRPC/, STS-B/, QQP/, MNLI/, QNLI/, RTE/, WNLI/), or run where "
             "the Hugging Face hub is reachable.")


@dataclass
class Task:
    """One task: its examples (loaded on demand), the kind of labels, the metrics and its recipe changes."""

    name: str
    kind: str                            # classification | regression
    metrics: tuple[str, ...]             # scored on each validation split; the task's score is their mean
    load: Callable[[], tuple[Examples, dict[str, Examples]]]  # (train, validation splits by name)
    labels: list[str] | None = None      # class names by id (None: regression)
    recipe: dict = field(default_factory=dict)  # FinetuneConfig keys this task changes
    source: str = ""
    files: dict[str, Path] = field(default_factory=dict)  # split name ("train", "dev", ...) -> its file, if local

    @property
    def num_labels(self) -> int:
        return 1 if self.kind == "regression" else len(self.labels or ())


@dataclass(frozen=True)
class GlueSpec:
    """Where a GLUE task's columns are in GLUE's own .tsv files and in the hub's `nyu-mll/glue` dataset."""

    folder: str
    dir_text: tuple[str, ...]
    dir_label: str
    hub_text: tuple[str, ...]
    labels: tuple[str, ...] | None       # names by id, in the hub's order; None: regression
    metrics: tuple[str, ...]
    dev: tuple[tuple[str, str, str], ...] = (("dev", "dev.tsv", "validation"),)  # (name, file, hub split)
    recipe: tuple[tuple[str, object], ...] = ()
    header: bool = True


_BINARY = ("0", "1")
_NLI = ("entailment", "not_entailment")
# Recipe (config/finetune.py): run_glue README's script uses 5 epochs on MRPC and WNLI; MNLI and QQP (~400k
# examples each) are run over 3 seeds, the small tasks over 5.
GLUE: dict[str, GlueSpec] = {
    "cola": GlueSpec("CoLA", ("3",), "1", ("sentence",), _BINARY, ("matthews",), header=False),
    "sst2": GlueSpec("SST-2", ("sentence",), "label", ("sentence",), _BINARY, ("accuracy",)),
    "mrpc": GlueSpec("MRPC", ("#1 String", "#2 String"), "Quality", ("sentence1", "sentence2"), _BINARY,
                     ("f1", "accuracy"), recipe=(("epochs", 5),)),
    "stsb": GlueSpec("STS-B", ("sentence1", "sentence2"), "score", ("sentence1", "sentence2"), None,
                     ("pearson", "spearman")),
    "qqp": GlueSpec("QQP", ("question1", "question2"), "is_duplicate", ("question1", "question2"), _BINARY,
                    ("f1", "accuracy"), recipe=(("seeds", 3),)),
    "mnli": GlueSpec("MNLI", ("sentence1", "sentence2"), "gold_label", ("premise", "hypothesis"),
                     ("entailment", "neutral", "contradiction"), ("accuracy",),
                     dev=(("m", "dev_matched.tsv", "validation_matched"),
                          ("mm", "dev_mismatched.tsv", "validation_mismatched")), recipe=(("seeds", 3),)),
    "qnli": GlueSpec("QNLI", ("question", "sentence"), "label", ("question", "sentence"), _NLI, ("accuracy",)),
    "rte": GlueSpec("RTE", ("sentence1", "sentence2"), "label", ("sentence1", "sentence2"), _NLI, ("accuracy",)),
    "wnli": GlueSpec("WNLI", ("sentence1", "sentence2"), "label", ("sentence1", "sentence2"), _BINARY,
                     ("accuracy",), recipe=(("epochs", 5),)),
}
GLUE_DEFAULT = tuple(name for name in GLUE if name != "wnli")  # WNLI: below the majority class for most models
_ALIASES = {"sst-2": "sst2", "sts-b": "stsb", "mnli-m": "mnli", "mnli-mm": "mnli"}


def _glue_from_dir(spec: GlueSpec, glue_dir: Path) -> tuple[Examples, dict[str, Examples]]:
    folder = glue_dir / spec.folder
    if not folder.is_dir():
        raise DataError(f"--glue-dir {glue_dir} has no {spec.folder}/ folder. {GLUE_HELP}")
    to_label = float_label if spec.labels is None else label_lookup(list(spec.labels))

    def read(name: str) -> Examples:
        return read_examples(folder / name, list(spec.dir_text), spec.dir_label, to_label, skip_malformed=True,
                             header=spec.header)

    return read("train.tsv"), {name: read(file) for name, file, _ in spec.dev}


def _glue_from_hub(name: str, spec: GlueSpec) -> tuple[Examples, dict[str, Examples]]:
    if not hub_offline() and not hub_reachable():  # datasets would retry for ~30 s before failing: say it at once
        raise DataError(f"Cannot load GLUE task '{name}': the Hugging Face hub is not reachable (no network?). If "
                        f"GLUE is in your datasets cache, set HF_DATASETS_OFFLINE=1 to load it from there. {GLUE_HELP}")
    try:
        import datasets

        data = datasets.load_dataset(GLUE_HUB_NAME, name)
    except Exception as error:  # offline, no such dataset, a hub error: all mean "get the files yourself"
        raise DataError(f"Cannot load GLUE task '{name}' from the Hugging Face hub ({type(error).__name__}: "
                        f"{str(error)[:200]}). {GLUE_HELP}") from None

    def split(hub_split: str) -> Examples:
        rows = data[hub_split]
        texts = list(zip(*(rows[column] for column in spec.hub_text)))
        return Examples(texts, [float(v) if spec.labels is None else int(v) for v in rows["label"]])

    return split("train"), {dev_name: split(hub_split) for dev_name, _, hub_split in spec.dev}


def glue_task(name: str, glue_dir: Path | None) -> Task:
    """A GLUE task by name (cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli), from `glue_dir` or the hub."""
    spec = GLUE[name]
    files = {}
    if glue_dir is not None:
        load, source = (lambda: _glue_from_dir(spec, glue_dir)), f"{glue_dir / spec.folder}"
        files = {"train": glue_dir / spec.folder / "train.tsv",
                 **{split: glue_dir / spec.folder / file for split, file, _ in spec.dev}}
    else:
        load, source = (lambda: _glue_from_hub(name, spec)), f"hub {GLUE_HUB_NAME}/{name}"
    return Task(name, "regression" if spec.labels is None else "classification", spec.metrics, load,
                None if spec.labels is None else list(spec.labels), dict(spec.recipe), source, files)


def task_from_file(path: Path) -> Task:
    """A task of the user's own from its YAML file (keys: config/finetune.py TaskFile); errors name file and key."""
    tree = read_yaml(path)
    try:
        spec: TaskFile = build_dataclass(TaskFile, tree)
        recipe = dict(tree.get("finetune") or {})
        finetune_config(recipe, [])  # its finetune section is checked now, not after the first seed
    except ConfigError as error:
        raise ConfigError(f"Task file {path}: {error}") from None
    texts = [spec.text] if isinstance(spec.text, str) else list(spec.text)
    problems = [f"'{key}' is not set" for key in ("name", "train", "validation") if not getattr(spec, key)]
    if not 1 <= len(texts) <= 2:
        problems.append(f"'text' names {len(texts)} columns; give one or two, e.g. text: [sentence1, sentence2]")
    if (spec.kind == "regression") != (spec.metric == "pearson_spearman"):
        problems.append(f"metric '{spec.metric}' does not fit kind '{spec.kind}' (regression goes with "
                        "pearson_spearman, classification with accuracy, f1 or matthews)")
    if problems:
        raise ConfigError(f"Task file {path}: " + "; ".join(problems) + ".")
    train, validation = (path.parent / spec.train), (path.parent / spec.validation)
    labels = None if spec.kind == "regression" else label_names(train, spec.label)
    if spec.metric == "f1" and labels is not None and len(labels) != 2:
        raise ConfigError(f"Task file {path}: metric f1 needs two labels; {train} has {len(labels)} "
                          f"({', '.join(labels[:10])}). Use accuracy or matthews.")
    if spec.positive_label is not None:
        # As label_names reads labels: YAML's bare `true` is the label "true", `1` the label "1".
        positive = str(spec.positive_label).lower() if isinstance(spec.positive_label, bool) else \
            str(spec.positive_label).strip()
        if spec.metric != "f1" or labels is None or positive not in labels:
            raise ConfigError(f"Task file {path}: 'positive_label' {positive!r} " + (
                "is for metric f1 only." if spec.metric != "f1" else f"is not a label of {train} "
                f"({', '.join(labels or [])})."))
        labels = [label for label in labels if label != positive] + [positive]
    to_label = float_label if labels is None else label_lookup(labels)

    def load() -> tuple[Examples, dict[str, Examples]]:
        return (read_examples(train, texts, spec.label, to_label),
                {"dev": read_examples(validation, texts, spec.label, to_label)})

    metrics = ("pearson", "spearman") if spec.metric == "pearson_spearman" else (spec.metric,)
    return Task(spec.name, spec.kind, metrics, load, labels, recipe, str(path), {"train": train, "dev": validation})


def resolve_tasks(tasks: str, glue_dir: Path | None) -> list[Task]:
    """--tasks: `glue` (every GLUE task but WNLI), a comma list of GLUE names, or task YAML files (mixable)."""
    found: list[Task] = []
    for item in (part.strip() for part in tasks.split(",") if part.strip()):
        key = _ALIASES.get(item.lower(), item.lower())
        if key == "glue":
            found += [glue_task(name, glue_dir) for name in GLUE_DEFAULT]
        elif key in GLUE:
            found.append(glue_task(key, glue_dir))
        elif item.endswith((".yaml", ".yml")) or Path(item).is_file():
            if not Path(item).is_file():
                raise ConfigError(f"--tasks: task file {item} does not exist.")
            found.append(task_from_file(Path(item)))
        else:
            raise ConfigError(f"--tasks: '{item}' is neither a GLUE task ({', '.join(GLUE)}, or 'glue' for all but "
                              "wnli) nor a task YAML file.")
    names = [task.name for task in found]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ConfigError(f"--tasks names {', '.join(duplicates)} more than once.")
    if not found:
        raise ConfigError("--tasks is empty: give glue, GLUE task names (e.g. rte,mrpc) or a task YAML file.")
    return found
