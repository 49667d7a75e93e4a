"""Typed configuration: dataclasses loaded from YAML, `--set section.key=value` overrides, validation.

schema.py holds the sections (every key documented in its field's `help`), yaml_tree.py the general
typed-YAML engine, validate.py the cross-field checks, reference.py the generated docs, load.py the
entry points. Import from here: `from bertrain.config import load_config, Config`.
"""

from bertrain.config.load import load_config, load_recipe
from bertrain.config.reference import config_reference_markdown, explain_lines, iter_docs
from bertrain.config.schema import (Config, DataConfig, LoggingConfig, ModelConfig, OptimConfig, PrepareConfig,
                                    Recipe, SourceConfig, TokenizerConfig, TrainConfig, opt)
from bertrain.config.validate import (ConfigWarning, check_precision_for_device, config_warnings,
                                      micro_batch_size_for, validate, validate_model)
from bertrain.config.yaml_tree import (build_dataclass, describe_yaml, dump_yaml, flatten, nearest_key, parse_override,
                                       read_tree, read_yaml, resolve_config_path, set_dotted, shipped_dir,
                                       shipped_files, to_dict, type_name)

__all__ = [
    "Config", "DataConfig", "LoggingConfig", "ModelConfig", "OptimConfig", "PrepareConfig", "Recipe",
    "SourceConfig", "TokenizerConfig", "TrainConfig", "opt",
    "load_config", "load_recipe", "validate", "validate_model", "micro_batch_size_for", "ConfigWarning",
    "check_precision_for_device", "config_warnings",
    "build_dataclass", "dump_yaml", "flatten", "parse_override", "read_tree", "read_yaml", "resolve_config_path",
    "set_dotted", "shipped_dir", "shipped_files", "describe_yaml", "nearest_key", "to_dict", "type_name",
    "config_reference_markdown", "explain_lines", "iter_docs",
]
