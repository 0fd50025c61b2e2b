"""tinker-cookbook's DPO trainer on a local JSONL of comparisons.

The cookbook's DPO command line (``tinker_cookbook.recipes.preference.dpo.train``) reads only
hub datasets; its library reads comparisons from a local file
(``ComparisonBuilderFromJsonl``). This driver wires that loader into the cookbook's own
``train_dpo.main``, unchanged — the few lines a user writes to run DPO on their own data:

    python examples/tinker/cookbook_dpo.py model_name=/path/to/model \\
        train_path=examples/data/tinker_comparisons.jsonl log_path=runs/dpo \\
        base_url=http://127.0.0.1:8000

Each line: ``{"comparison": {"prompt_conversation": [...], "completion_A": [...],
"completion_B": [...]}, "label": "A" | "B"}``.
"""

import chz
from tinker_cookbook import cli_utils
from tinker_cookbook.preference import train_dpo
from tinker_cookbook.preference.dpo_datasets import DPODatasetBuilderFromComparisons
from tinker_cookbook.preference.preference_datasets import ComparisonBuilderFromJsonl
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig


@chz.chz
class Args:
    model_name: str
    train_path: str
    log_path: str
    renderer_name: str = "role_colon"
    base_url: str | None = None
    load_checkpoint_path: str | None = None
    batch_size: int = 8  # comparisons per step (two sequences each)
    max_length: int | None = 256
    learning_rate: float = 1e-4
    lr_schedule: str = "constant"
    dpo_beta: float = 0.1
    lora_rank: int = 8
    num_epochs: int = 1
    max_steps: int | None = None
    save_every: int = 0


def main(args: Args) -> None:
    cli_utils.check_log_dir(args.log_path, behavior_if_exists="delete")
    common = ChatDatasetBuilderCommonConfig(
        model_name_for_tokenizer=args.model_name,
        renderer_name=args.renderer_name,
        max_length=args.max_length,
        batch_size=args.batch_size,
    )
    comparisons = ComparisonBuilderFromJsonl(train_path=args.train_path)
    config = train_dpo.Config(
        log_path=args.log_path,
        model_name=args.model_name,
        recipe_name="cookbook_dpo_local",
        renderer_name=args.renderer_name,
        dataset_builder=DPODatasetBuilderFromComparisons(
            common_config=common, comparison_builder=comparisons
        ),
        load_checkpoint_path=args.load_checkpoint_path,
        learning_rate=args.learning_rate,
        lr_schedule=args.lr_schedule,
        dpo_beta=args.dpo_beta,
        lora_rank=args.lora_rank,
        num_epochs=args.num_epochs,
        base_url=args.base_url,
        save_every=args.save_every,
        eval_every=0,
        infrequent_eval_every=0,
        max_steps=args.max_steps,
    )
    train_dpo.main(config)


if __name__ == "__main__":
    main(chz.entrypoint(Args))
