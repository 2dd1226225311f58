"""Hugging Face knowledge: resolving models, the user's factory and data, and
TrainingArguments.

A public name imports its module on first use; transformers is imported only inside
functions. `_packing` (the padding-free check) serves `levers` alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune._exports import lazy_exports

if TYPE_CHECKING:
    from autotune.hf.corpus import prepare
    from autotune.hf.factory import (
        FactoryError,
        args_class_of,
        build_trainer,
        class_name,
        import_class,
        load_factory,
        reference_of,
        resolve_reference,
    )
    from autotune.hf.job import job_facts, longest_samples
    from autotune.hf.levers import offer, parse_lever_options
    from autotune.hf.models import (
        build_model,
        count_parameters,
        max_positions,
        resolve_model,
    )
    from autotune.hf.peft import adapter_settings
    from autotune.hf.sharding import build_cpu_op, deepspeed_stage
    from autotune.hf.training_args import (
        TUNED,
        arguments_class,
        available_optimizers,
        base_arguments,
        checkpointing_field,
        cli_flags,
        merge,
        read_arguments_file,
        read_json_object,
        recipe,
        set_fields,
        study_arguments,
        training_fields,
        tuned_arguments,
        validate,
    )

__all__ = [
    "TUNED",
    "FactoryError",
    "adapter_settings",
    "args_class_of",
    "arguments_class",
    "available_optimizers",
    "base_arguments",
    "build_cpu_op",
    "build_model",
    "build_trainer",
    "checkpointing_field",
    "class_name",
    "cli_flags",
    "count_parameters",
    "deepspeed_stage",
    "import_class",
    "job_facts",
    "load_factory",
    "longest_samples",
    "max_positions",
    "merge",
    "offer",
    "parse_lever_options",
    "prepare",
    "read_arguments_file",
    "read_json_object",
    "recipe",
    "reference_of",
    "resolve_model",
    "resolve_reference",
    "set_fields",
    "study_arguments",
    "training_fields",
    "tuned_arguments",
    "validate",
]

# each public name, and the module that holds it
_OWNERS = {
    "prepare": "autotune.hf.corpus",
    "FactoryError": "autotune.hf.factory",
    "args_class_of": "autotune.hf.factory",
    "build_trainer": "autotune.hf.factory",
    "class_name": "autotune.hf.factory",
    "import_class": "autotune.hf.factory",
    "load_factory": "autotune.hf.factory",
    "reference_of": "autotune.hf.factory",
    "resolve_reference": "autotune.hf.factory",
    "job_facts": "autotune.hf.job",
    "longest_samples": "autotune.hf.job",
    "offer": "autotune.hf.levers",
    "parse_lever_options": "autotune.hf.levers",
    "build_model": "autotune.hf.models",
    "count_parameters": "autotune.hf.models",
    "max_positions": "autotune.hf.models",
    "resolve_model": "autotune.hf.models",
    "adapter_settings": "autotune.hf.peft",
    "build_cpu_op": "autotune.hf.sharding",
    "deepspeed_stage": "autotune.hf.sharding",
    "TUNED": "autotune.hf.training_args",
    "arguments_class": "autotune.hf.training_args",
    "available_optimizers": "autotune.hf.training_args",
    "base_arguments": "autotune.hf.training_args",
    "checkpointing_field": "autotune.hf.training_args",
    "cli_flags": "autotune.hf.training_args",
    "merge": "autotune.hf.training_args",
    "read_arguments_file": "autotune.hf.training_args",
    "read_json_object": "autotune.hf.training_args",
    "recipe": "autotune.hf.training_args",
    "set_fields": "autotune.hf.training_args",
    "study_arguments": "autotune.hf.training_args",
    "training_fields": "autotune.hf.training_args",
    "tuned_arguments": "autotune.hf.training_args",
    "validate": "autotune.hf.training_args",
}
__getattr__ = lazy_exports(__name__, _OWNERS)
