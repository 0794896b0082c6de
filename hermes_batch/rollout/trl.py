"""TRL's GRPOTrainer on hermes-batch rollouts (`pip install -e '.[rl]'`; TRL is pinned, its
`rollout_func` being marked experimental):

    env = TRLRollouts("data/example_rl.jsonl", run_name="grpo", model="local", toolsets=["terminal"])
    trainer = GRPOTrainer(model=policy, processing_class=tokenizer, args=GRPOConfig(...),
                          train_dataset=env.dataset(), reward_funcs=env.reward,
                          rollout_func=env.rollout_func, callbacks=[env.weight_sync()])

TRL repeats each prompt of a batch `num_generations` times, one after another: each run of equal
prompts is a group, and one call is one step of rollouts (engine.py), run token-exact against the
server that samples the policy. It returns `prompt_ids`, `completion_ids`, `logprobs` and `env_mask`
per rollout, and as extra fields its reward, rollout id and policy version; `reward` hands the
check's score to TRL (None, which TRL leaves out, where nothing decided it).

Weights: TRL syncs a vLLM server itself. With the embedded llama.cpp server (`model="local"`: the
CPU, tests, small setups) the policy's weights are written as GGUF (gguf.py) after each optimizer
step by `weight_sync()`, and the next step's rollouts are served from them; the policy version is
the trainer's global step, stamped on every rollout. `rollout_func` writes the weights itself when
no callback did, so a forgotten callback cannot make the run sample from stale weights.

On a rollout service (`TRLRollouts.on_service(url)`, service/steps.py) the sandboxes and the model's
server stay warm between steps, the dataset is the service's, and the rollouts are in the service's
run. A service on the embedded model (on this machine) is handed each step's weights as GGUF in its
policy directory; a vLLM server behind a service is synced by TRL itself (`use_vllm=True,
vllm_mode="server"`)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from ..llm.local_model import resolve_model_file
from .engine import Rollout, Rollouts, Step
from .gguf import write_gguf
from .service import ServiceClient, ServiceRollouts


class TRLRollouts:
    """A dataset of hermes-batch tasks as TRL's rollout function and reward.

    `flags`: the run's usual flags (`model`, `backend`, `toolsets`, `max_turns`, `max_tokens`, …).
    `vocabulary`: the GGUF file whose vocabulary the policy shares (default: the embedded model's).
    `sync=False` keeps serving the first weights (an off-policy control, for tests)."""

    def __init__(self, dataset_file: str | Path, *, run_name: str, output_dir: str | Path = "data",
                 eval_dataset_file: str | Path | None = None, vocabulary: str | Path | None = None,
                 sync: bool = True, errored: str = "sample", drop_zero_variance: bool = False, **flags: Any) -> None:
        engine = Rollouts(dataset_file, run_name=run_name, output_dir=output_dir,
                          eval_dataset_file=eval_dataset_file, errored=errored,  # type: ignore[arg-type]
                          drop_zero_variance=drop_zero_variance, **flags)
        self._use(engine, engine.config.uses_local_model, engine.run_dir / "policy", vocabulary, sync)

    @classmethod
    def on_service(cls, service: Any, *, token: str | None = None, vocabulary: str | Path | None = None,
                   sync: bool = True, errored: str = "sample", drop_zero_variance: bool = False,
                   timeout: float | None = None) -> TRLRollouts:
        """Rollouts asked of a rollout service: a `RolloutService` of this process, a `ServiceClient`,
        or the URL of `python batch_runner.py serve` (`token`: its bearer token, else
        $HERMES_BATCH_SERVE_TOKEN). The dataset is the service's, and every rollout is stamped with
        the trainer's step. Weights: a service on the embedded model (on this machine) is handed
        each step's as GGUF, written into its policy directory (`vocabulary`, `sync` as above);
        any other model's server is the trainer's to sync (TRL's vLLM server mode)."""
        if isinstance(service, str):
            service = ServiceClient(service, token=token)
        self = cls.__new__(cls)
        engine = ServiceRollouts(service, errored=errored, drop_zero_variance=drop_zero_variance,  # type: ignore[arg-type]
                                 timeout=timeout)
        policy_dir = engine.info.policy_dir
        if policy_dir is not None and not Path(policy_dir).is_dir():
            raise ValueError(f"the rollout service serves the embedded model, whose weights this trainer writes into "
                             f"its policy directory {policy_dir}, which is not on this machine: run the trainer "
                             "beside the service, or serve the policy with vLLM (TRL syncs it)")
        self._use(engine, policy_dir is not None, Path(policy_dir) if policy_dir else None, vocabulary, sync)
        return self

    def _use(self, engine: Rollouts | ServiceRollouts, serves_weights: bool, policy_dir: Path | None,
             vocabulary: str | Path | None, sync: bool) -> None:
        self.engine = engine
        self.serves_weights = serves_weights  # the embedded model's weights are this process's to write
        self.policy_dir = policy_dir
        self.vocabulary = Path(vocabulary) if vocabulary else None
        self.sync = sync
        self.written: list[int] = []  # versions whose weights this process has written, in order
        self.steps: list[Step] = []  # what each call returned, for logs and tests

    def dataset(self) -> Any:
        """The training prompts as a `datasets.Dataset` with a `prompt` column (TRL's train_dataset)."""
        from datasets import Dataset

        return Dataset.from_dict({"prompt": self.engine.prompts})

    def eval_dataset(self) -> Any:
        """The prompts of `eval_dataset_file`, likewise (TRL's eval_dataset)."""
        from datasets import Dataset

        if not isinstance(self.engine, Rollouts):
            raise ValueError("a rollout service has one dataset: build the eval dataset from the prompts you "
                             "keep out of training (every prompt of the service's dataset can be asked)")
        return Dataset.from_dict({"prompt": self.engine.eval_prompts})

    # --- TRL's rollout_func --------------------------------------------------------------------
    def rollout_func(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        if getattr(trainer.accelerator, "num_processes", 1) > 1:
            raise RuntimeError("hermes-batch rollouts serve one trainer process for now: each process would run "
                               "its own share of a group as a step of its own (use one process)")
        version = int(trainer.state.global_step)
        model = _unwrapped(trainer.model)
        weights = self.weights(model, version) if self.serves_weights else None
        step = self.engine.run([_text(p) for p in prompts], version, policy=fingerprint(model),
                               tag="train" if model.training else "eval", weights=weights,
                               temperature=getattr(trainer.args, "temperature", None))
        self.steps.append(step)
        return _for_trl(step, trainer.processing_class.eos_token_id)

    @staticmethod
    def reward(prompts: list[Any], completions: list[Any], hermes_reward: list[float | None],
               **_: Any) -> list[float | None]:
        """The check's score of each rollout (TRL's reward function)."""
        return list(hermes_reward)

    # --- weights -------------------------------------------------------------------------------
    def weights(self, model: Any, version: int) -> Path:
        """The GGUF file serving `version`: written from `model` once per version by this process
        (a file of that name left by another process, an earlier training, is written over), and
        the files of other versions but the one written before it removed (those above it are
        stale; the one before may still be served, and is what a server falls back to)."""
        served = version if self.sync else 0
        assert self.policy_dir is not None, "only the embedded model's weights are written"
        path = self.policy_dir / f"policy-v{served:06d}.gguf"
        if served not in self.written:
            vocabulary = self.vocabulary or resolve_model_file(None, progress=False)
            write_gguf(_unwrapped(model), path, vocabulary)
            before = self.written[-1] if self.written else served - 1
            self.written.append(served)
            for old in self.policy_dir.glob("policy-v*.gguf"):
                number = old.stem.removeprefix("policy-v")
                if number.isdigit() and int(number) not in (served, before):
                    old.unlink(missing_ok=True)
        return path

    def weight_sync(self) -> Any:
        """A TrainerCallback writing the weights of each new global step as GGUF, as soon as the
        optimizer has stepped (the next rollouts are served from them)."""
        from transformers import TrainerCallback

        rollouts = self

        class WeightSync(TrainerCallback):
            def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **_: Any) -> None:
                if rollouts.serves_weights and rollouts.sync and model is not None and state.is_world_process_zero:
                    rollouts.weights(model, int(state.global_step))

        return WeightSync()


def _for_trl(step: Step, eos: int) -> dict[str, list[Any]]:
    """TRL's columns, one entry per rollout; a rollout without a sequence gets its group's prompt and
    one masked end-of-text token, with no reward (TRL needs an entry for every prompt it gave)."""
    usable = [r for r in step.rollouts if r.usable]
    if not usable:
        raise RuntimeError(f"no rollout of step {step.version} has a token sequence; see the run {step.source}")
    prompt_of: dict[str, list[int]] = {}
    for r in usable:
        prompt_of.setdefault(r.prompt_id, r.prompt_ids)
    rows = [r if r.usable else _stand_in(r, prompt_of.get(r.prompt_id) or usable[0].prompt_ids, eos)
            for r in step.rollouts]
    return {"prompt_ids": [r.prompt_ids for r in rows], "completion_ids": [r.completion_ids for r in rows],
            "logprobs": [r.logprobs for r in rows],  # NaN where the server gave none: TRL leaves those out
            "env_mask": [r.env_mask for r in rows],
            "hermes_reward": [r.reward for r in rows],
            "rollout_id": [f"{step.source}/{r.rollout_id}" for r in rows],
            "policy_version": [r.policy_version for r in rows]}


def _stand_in(r: Rollout, prompt_ids: list[int], eos: int) -> Rollout:
    return Rollout(r.rollout_id, r.prompt_id, r.sample, r.policy_version, list(prompt_ids), [eos], [0], [0.0],
                   None, r.verdict, r.error)


def _text(prompt: Any) -> str:
    """A prompt as the dataset gave it: text, or (conversational) its last user message's text."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
        return str(prompt[-1].get("content", ""))
    raise TypeError(f"a prompt TRL gave is neither text nor messages: {type(prompt).__name__}")


def fingerprint(model: Any) -> str:
    """Names a model's weights as they are now: each tensor's shape and sum (one pass, no copy)."""
    import torch

    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        total = tensor.detach().sum(dtype=torch.float64).item()
        digest.update(f"{name}:{tuple(tensor.shape)}:{total:.17g};".encode())
    return digest.hexdigest()[:16]


def _unwrapped(model: Any) -> Any:
    return getattr(model, "module", model)  # accelerate's wrappers keep the model as .module
