"""Typed configuration: dataclasses loaded from YAML, `--set section.key=value` overrides, validation.
Import from here: `from bertrain.config import ...`."""

from bertrain.config.load import load_config, load_config_or_recipe, load_recipe
from bertrain.config.reference import config_reference_markdown, explain_lines
from bertrain.config.schema import (AUTO_MIN_PADDED_WIDTH, AUTO_MIN_PADDING_SHARE, Config,
                                    DataConfig, LoggingConfig, ModelConfig, OptimConfig, PrepareConfig, Recipe,
                                    SourceConfig, TokenizerConfig, TrainConfig)
from bertrain.config.validate import (ConfigWarning, check_precision_for_device, fit_micro_batch_size,
                                      micro_batch_size_for, validate_model)
from bertrain.config.yaml_tree import (build_dataclass, describe_yaml, dump_yaml, read_yaml, resolve_config_path,
                                       flatten, shipped_dir, shipped_files, to_dict)
from bertrain.config.overrides import set_dotted

__all__ = [
    "AUTO_MIN_PADDED_WIDTH", "AUTO_MIN_PADDING_SHARE", "Config", "ConfigWarning", "DataConfig",
    "LoggingConfig", "ModelConfig", "OptimConfig", "PrepareConfig", "Recipe", "SourceConfig", "TokenizerConfig",
    "TrainConfig", "build_dataclass", "check_precision_for_device", "config_reference_markdown", "describe_yaml",
    "dump_yaml", "explain_lines", "flatten", "fit_micro_batch_size", "load_config", "load_config_or_recipe",
    "load_recipe", "micro_batch_size_for", "read_yaml", "resolve_config_path", "set_dotted", "shipped_dir",
    "shipped_files", "to_dict", "validate_model",
]
