"""Entry point: python batch_runner.py --dataset_file=data/example_prompts.jsonl --run_name=my_first_run ..."""

from hermes_batch.cli import entry

if __name__ == "__main__":
    entry()
