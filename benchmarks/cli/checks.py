"""``grpo-bench check {trl,mu1,trl-train,references,same-batch}``: correctness checks whose numbers go into results/ and the README.

The checks import TRL only when they run: it takes seconds to import and `grpo-bench run` never needs it."""

from __future__ import annotations

from benchmarks.checks.mu1 import Mu1Settings, run_mu1_check
from benchmarks.checks.precision import PrecisionSettings, run_precision_check
from benchmarks.checks.references import CASES, FRAMEWORKS, PLANTS, ReferencesSettings, run_references_check
from benchmarks.checks.same_batch import SameBatchSettings, run_same_batch_check
from benchmarks.checks.trl import TrlCheckSettings, run_trl_check
from benchmarks.checks.trl_train import TrlTrainSettings, run_trl_train_check
from benchmarks.cli.options import comma_list, seed_value


def add_check_parser(subparsers) -> None:
    check = subparsers.add_parser("check", help="cross-check the losses against TRL, verl and OpenRLHF, or verify the mu = 1 behaviour")
    which = check.add_subparsers(dest="check", required=True, parser_class=type(check))

    trl = which.add_parser("trl", help="grpo_loss, group_advantages and dpo_loss against TRL's own trainers")
    trl.add_argument("--out", default=TrlCheckSettings.out, help="directory for report.md, results.csv, results.json")
    trl.set_defaults(handler=cmd_check_trl)

    mu1 = which.add_parser("mu1", help="why the GRPO loss reads 0 at mu = 1 while the policy still learns")
    mu1.add_argument("--task", default=Mu1Settings.task, help="task to train and roll out on")
    mu1.add_argument("--steps", type=int, default=Mu1Settings.steps, help="training steps of the mu = 1, beta = 0 run")
    mu1.add_argument("--seed", type=seed_value, default=Mu1Settings.seed, help="seed")
    mu1.add_argument("--out", default=Mu1Settings.out, help="directory for report.md, results.json, mu1.png "
                                                            "(default: results/mu1, or results/mu1-TASK for another task)")
    mu1.add_argument("--group-size", dest="group_size", type=int, default=None, help="G (default: GRPO's)")
    mu1.add_argument("--prompts-per-step", dest="prompts_per_step", type=int, default=None, help="prompts per step (default: GRPO's)")
    mu1.add_argument("--learning-rate", dest="learning_rate", type=float, default=None, help="(default: the task's)")
    mu1.add_argument("--max-new-tokens", dest="max_new_tokens", type=int, default=None, help="completion length cap (default: the task's)")
    mu1.add_argument("--eval-questions", dest="eval_questions", type=int, default=None, help="gsm8k: evaluation questions")
    mu1.add_argument("--eval-k", dest="eval_k", type=int, default=None, help="gsm8k: samples per evaluation question")
    mu1.add_argument("--eval-every", dest="eval_every", type=int, default=None, help="evaluate every N steps (default: steps // 6)")
    mu1.add_argument("--mu-steps", dest="mu_steps", type=int, default=None, help="steps of the mu = 4 run (default: 5)")
    mu1.add_argument("--metric", choices=("accuracy", "reward"), default=None,
                     help="evaluation metric that must rise (default: accuracy; GSM8K at 135M: reward)")
    mu1.add_argument("--readme", default=Mu1Settings.readme,
                     help="page whose 'mu1' section is regenerated ('': none; default: results/checks.md, none with --out)")
    mu1.set_defaults(handler=cmd_check_mu1)

    train = which.add_parser("trl-train", help="TRL's GRPOTrainer and ours trained on pizza with matched settings")
    train.add_argument("--steps", type=int, default=TrlTrainSettings.steps, help="training steps per run")
    train.add_argument("--seeds", type=int, default=TrlTrainSettings.seeds, help="seeds 0..N-1 for each implementation")
    train.add_argument("--out", default=TrlTrainSettings.out, help="directory for report.md, results.json, rewards.png")
    train.set_defaults(handler=cmd_check_trl_train)

    same = which.add_parser("same-batch", help="the GRPO step's loss against TRL's on the same sampled batches, part by part")
    same.add_argument("--workloads", default=",".join(SameBatchSettings().workloads),
                      help="comma-separated workloads of bench grpo-vs-trl (default: all of them)")
    same.add_argument("--batches", type=int, default=SameBatchSettings.batches, help="sampled batches per workload")
    same.add_argument("--seed", type=seed_value, default=SameBatchSettings.seed, help="seed of the trainers and prompt draws")
    same.add_argument("--out", default=SameBatchSettings.out, help="directory for report.md, results.json")
    same.set_defaults(handler=cmd_check_same_batch)

    prec = which.add_parser("precision", help="one step's gradient at bf16 (and bf16 with fp32 logits) against fp32, "
                                              "per algorithm, on the same batch")
    prec.add_argument("--matrix", default=PrecisionSettings.matrix, help="matrix file whose variants are measured")
    prec.add_argument("--task", default=None, help="the matrix's task label (default: its first)")
    prec.add_argument("--variants", type=comma_list, default=None, help="comma-separated variants (default: all)")
    prec.add_argument("--batches", type=int, default=PrecisionSettings.batches, help="sampled batches per variant")
    prec.add_argument("--seed", type=seed_value, default=PrecisionSettings.seed, help="seed")
    prec.add_argument("--out", default=PrecisionSettings.out, help="directory for gradients.md, gradients.json")
    prec.set_defaults(handler=cmd_check_precision)

    refs = which.add_parser("references", help="every estimator and loss against verl, OpenRLHF and TRL 1.12's PPO")
    refs.add_argument("--install", action="store_true",
                      help="first fetch the pinned frameworks (pip install --no-deps --target into "
                           "$GRPO_BENCH_REFERENCES, default ~/.cache/grpo-bench/references)")
    refs.add_argument("--out", default=ReferencesSettings.out, help="directory for references.md, references.csv, features.md")
    refs.add_argument("--frameworks", nargs="+", default=list(FRAMEWORKS), metavar="NAME",
                      help=f"frameworks to compare against (default: all of {', '.join(FRAMEWORKS)})")
    refs.add_argument("--cases", nargs="+", default=list(CASES), metavar="CASE",
                      help=f"batches: {', '.join(CASES)} (default: all)")
    refs.add_argument("--plant", default=None, metavar="NAME",
                      help=f"run one planted error and write nothing; exit 1 when it is caught ({', '.join(p.name for p in PLANTS)})")
    refs.add_argument("--no-plants", dest="plants", action="store_false", help="skip the planted errors")
    refs.add_argument("--readme", default=None, metavar="README", help="also write the feature table into this README (section 'features')")
    refs.set_defaults(handler=cmd_check_references)


def cmd_check_trl(args) -> int:
    return run_trl_check(TrlCheckSettings(out=args.out))


def cmd_check_mu1(args) -> int:
    settings = Mu1Settings(
        task=args.task, steps=args.steps, seed=args.seed, out=args.out, readme=args.readme, group_size=args.group_size,
        prompts_per_step=args.prompts_per_step, learning_rate=args.learning_rate, max_new_tokens=args.max_new_tokens,
        eval_questions=args.eval_questions, eval_k=args.eval_k, eval_every=args.eval_every, mu_steps=args.mu_steps,
        metric=args.metric)
    return run_mu1_check(settings, command=args.command_line)


def cmd_check_trl_train(args) -> int:
    settings = TrlTrainSettings(steps=args.steps, seeds=args.seeds, out=args.out)
    return run_trl_train_check(settings, command=args.command_line)


def cmd_check_references(args) -> int:
    settings = ReferencesSettings(out=args.out, frameworks=tuple(args.frameworks), cases=tuple(args.cases),
                                  install=args.install, plant=args.plant, plants=args.plants,
                                  readme=args.readme)
    return run_references_check(settings, command=args.command_line)


def cmd_check_same_batch(args) -> int:
    settings = SameBatchSettings(workloads=comma_list(args.workloads), batches=args.batches, seed=args.seed, out=args.out)
    run_same_batch_check(settings, command=args.command_line)
    return 0


def cmd_check_precision(args) -> int:
    return run_precision_check(PrecisionSettings(matrix=args.matrix, task=args.task, variants=args.variants,
                                                 batches=args.batches, seed=args.seed, out=args.out))
