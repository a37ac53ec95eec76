"""Which Horovod recipe works under which hvdx strategy, each verdict tied to the tests
that show it: the source of ``docs/compatibility.md``.

A cell is ``(verdict, note, tests)``: ``works`` (as under Horovod), ``changed`` (works;
a value differs by the strategy's design, said in the note), ``refused`` (every rank
that meets it gets a ``ValueError`` or ``RuntimeError`` saying what to do instead),
``fails`` (as under Horovod 0.28.1 itself) or ``untested`` (no test of the project
shows it yet; ``tests`` is empty). Each test is ``path::function``.
``tests/unit/test_compatibility_table.py`` checks that every named test exists and that
the docs page is :func:`render`'s output, so that the page cannot drift from the tests.
Regenerate the page with ``python tests/recipes.py``.
"""

import pathlib
import sys
from typing import Dict, List, NamedTuple, Tuple

if __name__ == "__main__":  # run as a script: hvdx is this checkout's
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from hvdx.strategies import catalogue  # noqa: E402


def columns() -> Dict[str, str]:
    """The table's columns, key -> heading: Horovod alone, then each built-in strategy
    chosen by ``compression=`` or ``sync=`` that has a constructor of its own (not the
    entries registered classes share), titled as its catalogue entry, in catalogue
    order (read at each call)."""
    return dict({"horovod": "no strategy"}, **{
        d.name: d.title for d in catalogue.BUILT_IN
        if d.kind in ("compression", "sync") and d.constructors})


COLUMNS = columns()
#: The columns whose cells are written below (:func:`every` fills these); a strategy of
#: the catalogue that is not among them is ``untested`` in every row until its cells
#: are written (:func:`cells_of`).
WRITTEN = ("horovod", "topk", "dssync", "decentralized")
VERDICTS = ("works", "changed", "refused", "fails", "untested")

RECIPES_TORCH = "tests/mpi/torch_mixing/test_horovod_recipes.py"
TOPK_TORCH = "tests/mpi/torch/test_torch_topk.py"
DROPIN_TORCH = "tests/mpi/torch/test_torch_dropin.py"
MIXING_RELIABILITY = "tests/mpi/torch_mixing/test_mixing_reliability.py"
CHECKPOINT_TORCH = "tests/mpi/torch_mixing/test_checkpoint_resume.py"
MATRIX_TORCH = "tests/mpi/torch_mixing/test_recipe_matrix.py"
CHECKS_TORCH = "tests/mpi/torch_mixing/test_horovod_checks.py"
KERAS = "tests/mpi/tensorflow_mixing/test_tf_keras_recipes.py"
TOPK_TF = "tests/mpi/tensorflow/test_tf_topk.py"
#: With no strategy, hvdx's entry point returns Horovod's own optimizer object.
HOROVODS_OWN = f"{DROPIN_TORCH}::test_with_no_hvdx_feature_the_optimizer_is_horovods_own"


class Cell(NamedTuple):
    verdict: str
    note: str
    tests: Tuple[str, ...]


class Recipe(NamedTuple):
    framework: str
    name: str
    cells: Dict[str, Cell]


def cell(verdict: str, note: str = "", *tests: str) -> Cell:
    return Cell(verdict, note, tests)


def every(verdict: str, note: str, *tests: str) -> Dict[str, Cell]:
    return {column: cell(verdict, note, *tests) for column in WRITTEN}


def cells_of(recipe: Recipe) -> Dict[str, Cell]:
    """``recipe``'s cell in each of :func:`columns`: its own, else ``untested``."""
    return {column: recipe.cells.get(column, cell("untested")) for column in columns()}


NEW_JOB = "tests/launch/test_resume_in_a_new_job.py"


def _resume(note=""):
    return cell("works", note, f"{RECIPES_TORCH}::"
                "test_the_rank0_resume_recipe_gives_every_rank_the_roots_state",
                f"{NEW_JOB}::test_every_rank_holds_the_roots_state_and_trains_one_model_"
                "after_a_new_job")


RECIPES: List[Recipe] = [
    Recipe("PyTorch", "rank 0 alone saves (`torch.save`) and loads, in the same job or "
           "a new one; then `broadcast_parameters`, `broadcast_optimizer_state` (SGD with "
           "momentum, Adam; a parameter that never has a gradient)", {
               "horovod": _resume("Horovod's own function: its zero-gradient step moves "
                                  "the other ranks' parameters by weight decay"),
               "topk": _resume("both presets too; each rank keeps its own residuals and "
                               "its compressed tensors' momentum-correction velocities "
                               "(a rank that loaded none starts them from zero; rank 0 "
                               "says so), the dense tensors' velocities are the root's"),
               "dssync": _resume("a parameter without a gradient too: every rank takes "
                                 "the shape of the root's optimizer state"),
               "decentralized": _resume("a parameter without a gradient too: every rank "
                                        "takes the shape of the root's optimizer state"),
           }),
    Recipe("PyTorch", "a second `DistributedOptimizer` in the same job, after the first "
           "trained, saved and loaded", every(
               "works", "trains as a lone first optimizer would",
               f"{RECIPES_TORCH}::test_a_second_optimizer_trains_after_the_first_saved_"
               "and_loaded")),
    Recipe("PyTorch", "two `DistributedOptimizer`s stepping in turn (a GAN)", every(
        "works", "", f"{RECIPES_TORCH}::test_two_optimizers_train_alternately_as_in_a_gan")),
    Recipe("PyTorch", "`save_checkpoint` on rank 0 only",
           every("refused", "every rank that called it: `RuntimeError` after "
                 "`HVDX_CHECKPOINT_TIMEOUT` s; call it on every rank",
                 f"{RECIPES_TORCH}::test_saving_on_rank_0_alone_fails_there_within_the_timeout")),
    Recipe("PyTorch", "`save_checkpoint` / `load_checkpoint` on every rank",
           every("works", "each rank resumes its own state, bit for bit",
                 f"{CHECKPOINT_TORCH}::"
                 "test_resuming_from_a_checkpoint_is_bitwise_an_uninterrupted_run")),
    Recipe("PyTorch", "`DistributedOptimizer(..., process_set=...)`", {
        **{c: cell("works", "the ranks outside the set step alone, as in Horovod",
                   f"{RECIPES_TORCH}::"
                   "test_a_process_set_averages_inside_it_and_the_others_step_alone")
           for c in ("horovod", "topk")},
        "dssync": cell("refused", "the strategy picks its own groups",
                       f"{RECIPES_TORCH}::"
                       "test_parameter_mixing_refuses_a_process_set_on_every_rank"),
        "decentralized": cell("refused", "the graph picks its own peers",
                              f"{RECIPES_TORCH}::"
                              "test_parameter_mixing_refuses_a_process_set_on_every_rank"),
    }),
    Recipe("PyTorch", "`hvd.join()` with uneven data", {
        "horovod": cell("works", "", f"{RECIPES_TORCH}::"
                        "test_join_is_horovods_once_no_strategy_trains"),
        "topk": cell("works", "a joined rank counts as zeros in the others' averages, as "
                     "under Horovod; its residuals wait, its schedule goes on",
                     f"{RECIPES_TORCH}::test_join_under_topk_at_ratio_1_is_horovods_join",
                     f"{RECIPES_TORCH}::test_join_under_topk_leaves_the_joined_ranks_"
                     "residuals_and_keeps_one_schedule"),
        **{column: cell("refused", "a joined rank would give its group zeros to average "
                        "or leave its neighbours waiting; give every rank the same number "
                        "of steps", f"{RECIPES_TORCH}::"
                        "test_join_is_refused_while_a_parameter_mixing_strategy_trains")
           for column in ("dssync", "decentralized")},
    }),
]


def _identity(recipe: str, mixing: Cell = None) -> Dict[str, Cell]:
    """A per-step recipe under each strategy's identity setting, against Horovod."""
    test = f"{MATRIX_TORCH}::test_the_identity_setting_trains_as_horovod_under_each_recipe"
    works = cell("works", "", test)
    return {"horovod": cell("works", "Horovod's own optimizer", HOROVODS_OWN),
            "topk": works, "dssync": mixing or works, "decentralized": mixing or works}


_CLIPPED_LOCALLY = cell(
    "changed", "clips each rank's own gradient before its local step: parameter mixing "
    "never averages gradients",
    f"{MATRIX_TORCH}::test_parameter_mixing_clips_each_ranks_own_gradient_before_its_local_step")


def _checks(test: str) -> Dict[str, Cell]:
    return {"horovod": cell("works", "Horovod's own optimizer", HOROVODS_OWN),
            **{c: cell("works", "Horovod's check, with its message",
                       f"{CHECKS_TORCH}::{test}")
               for c in ("topk", "dssync", "decentralized")}}


RECIPES += [
    Recipe("PyTorch", "clipping: `synchronize()`, clip, `step()` in `skip_synchronize()`",
           _identity("clipping", _CLIPPED_LOCALLY)),
    Recipe("PyTorch", "`backward_passes_per_step=2`", _identity("backward_passes_per_step")),
    Recipe("PyTorch", "`gradient_predivide_factor`", _identity("gradient_predivide_factor")),
    Recipe("PyTorch", "`num_groups`", _identity("groups")),
    Recipe("PyTorch", "param groups with their own learning rates, an lr scheduler",
           _identity("lr_schedule")),
    Recipe("PyTorch", "a parameter without a gradient in some steps", _identity("plain")),
    Recipe("PyTorch", "sparse gradients (`nn.Embedding(sparse=True)`)",
           _identity("sparse_gradients")),
    Recipe("PyTorch", "`sparse_as_dense=True`", _identity("sparse_as_dense")),
    Recipe("PyTorch", "AMP: `GradScaler` with `synchronize()` / `skip_synchronize()`", {
        "horovod": cell("works", "Horovod's own optimizer", HOROVODS_OWN),
        "topk": cell("works", "an overflow on any rank makes every rank's gradients NaN; "
                     "no residual changes", f"{TOPK_TORCH}::test_amp_grad_scaler_skips_an_"
                     "overflow_on_one_rank_on_every_rank_and_trains_as_without_it"),
        **{c: cell("works", "`synchronize()` agrees on an overflow across ranks",
                   f"{MIXING_RELIABILITY}::test_an_overflow_on_one_rank_makes_every_rank_"
                   "skip_the_step_under_grad_scaler") for c in ("dssync", "decentralized")},
    }),
    Recipe("PyTorch", "Adam and the other `torch.optim` optimizers", {
        "horovod": cell("works", "Horovod's own optimizer", HOROVODS_OWN),
        "topk": cell("works", "the presets use DGC's momentum correction with SGD only, "
                     "and say so", f"{TOPK_TORCH}::test_presets_use_momentum_correction_"
                     "only_for_sgd_with_plain_momentum"),
        "dssync": _resume(), "decentralized": _resume(),
    }),
    Recipe("PyTorch", "`named_parameters` missing a parameter",
           _checks("test_named_parameters_missing_a_parameter_is_refused_with_horovods_error")),
    Recipe("PyTorch", "duplicate names in `named_parameters`",
           _checks("test_duplicate_names_are_refused_with_horovods_error")),
    Recipe("PyTorch", "no `named_parameters`", _checks(
        "test_an_optimizer_without_named_parameters_names_every_parameter_and_trains")),
    Recipe("PyTorch", "`step()` after `synchronize()` without `skip_synchronize()`", {
        **_checks("test_step_after_synchronize_warns_as_horovod_where_it_would_"
                  "synchronize_again"),
        **{c: cell("changed", "no warning: `step()` synchronizes no gradients there",
                   f"{CHECKS_TORCH}::test_step_after_synchronize_warns_as_horovod_where_"
                   "it_would_synchronize_again") for c in ("dssync", "decentralized")},
    }),
    Recipe("PyTorch", "`zero_grad(set_to_none=True)`", {
        "horovod": cell("fails", "Horovod's optimizer takes no argument: call `zero_grad()`",
                        f"{MATRIX_TORCH}::test_zero_grad_set_to_none_as_torch_has_it_by_default"),
        **{c: cell("works", "", f"{MATRIX_TORCH}::test_zero_grad_set_to_none_as_torch_has_"
                   "it_by_default") for c in ("topk", "dssync", "decentralized")},
    }),
    Recipe("Keras", "`fit` with `BroadcastGlobalVariablesCallback`, "
           "`MetricAverageCallback`, `LearningRateWarmupCallback`, "
           "`LearningRateScheduleCallback`",
           every("works", "", f"{KERAS}::test_fit_with_horovods_callbacks_under_each_strategy")),
    Recipe("Keras", "rank 0 alone `hvd.load_model`, then `BroadcastGlobalVariablesCallback`",
           every("works", "hvdx's `load_model` wraps the optimizer with hvdx's; as under "
                 "Horovod, the ranks' models must be named alike (the callback matches "
                 "variables by name)",
                 f"{KERAS}::test_rank0_loads_the_model_and_the_callback_broadcasts_it")),
    Recipe("Keras", "`LossScaleOptimizer`, `mixed_float16`", {
        "horovod": cell("works", "Horovod's allreduce spreads an overflow to every rank",
                        "tests/mpi/tensorflow_mixing/test_tf_mixed_precision.py::"
                        "test_an_overflow_on_one_rank_skips_the_step_on_every_rank"),
        "topk": cell("works", "an overflow on any rank makes every rank's gradients NaN",
                     f"{TOPK_TF}::test_fit_under_mixed_float16_survives_an_overflow_on_one_rank",
                     f"{TOPK_TF}::test_a_loss_scale_optimizer_skips_an_overflow_on_one_rank_"
                     "on_every_rank"),
        **{c: cell("works", "an overflow on any rank is skipped on every rank",
                   "tests/mpi/tensorflow_mixing/test_tf_mixed_precision.py::"
                   "test_fit_under_mixed_float16_survives_an_overflow_on_one_rank",
                   "tests/mpi/tensorflow_mixing/test_tf_mixed_precision.py::"
                   "test_an_overflow_on_one_rank_skips_the_step_on_every_rank")
           for c in ("dssync", "decentralized")},
    }),
]


TF_DROPIN = "tests/mpi/tensorflow/test_tf_dropin.py"
TF_DSSYNC = "tests/mpi/tensorflow_mixing/test_tf_dssync.py"
TF_GRAPH = "tests/mpi/tensorflow_mixing/test_tf_decentralized.py"

RECIPES += [
    Recipe("TensorFlow", "`DistributedGradientTape`, eager and in `tf.function`", {
        "horovod": cell("works", "Horovod's own tape, bit for bit", f"{TF_DROPIN}::"
                        "test_gradient_tape_twenty_steps_bitwise_identical_to_horovod"),
        "topk": cell("works", "", f"{TOPK_TF}::"
                     "test_tape_update_equals_the_numpy_reference_bitwise"),
        "dssync": cell("works", "", f"{TF_DSSYNC}::"
                       "test_matches_the_numpy_reference_with_the_swa_merge"),
        "decentralized": cell("works", "combine-then-adapt only: the tape mixes before "
                              "the step; adapt-then-combine is refused", f"{TF_GRAPH}::"
                              "test_steps_match_explicit_mixing_matrices", f"{TF_GRAPH}::"
                              "test_adapt_then_combine_on_the_tape_is_refused_naming_the_order"),
    }),
    Recipe("TensorFlow", "`hvd.broadcast_variables` of the model's and the optimizer's "
           "variables after the first step", every(
               "works", "", f"{KERAS}::test_the_tape_recipe_broadcasts_the_model_and_"
               "optimizer_variables_after_step_one")),
    Recipe("TensorFlow", "`tape.register_local_source(v)`", {
        **{c: cell("works", "`v` keeps its own gradient, divided by the number of ranks "
                   "(`scale_local_gradients`)", f"{TOPK_TF}::test_a_local_variable_keeps_its_own_gradient_divided_by_the_ranks")
           for c in ("horovod", "topk")},
        **{c: cell("works", "`v` is never mixed; its gradient is the local one (divided by "
                   "the number of ranks with `scale_local_gradients`, as under Horovod)",
                   "tests/mpi/tensorflow_mixing/test_tf_keras_horovod_api.py::"
                   "test_a_local_source_of_the_tape_stays_out_of_the_mix")
           for c in ("dssync", "decentralized")},
    }),
    Recipe("TensorFlow", "`hvd.join()` with uneven data", {
        "horovod": cell("works", "", f"{KERAS}::test_join_is_horovods_while_no_strategy_"
                        "was_built"),
        **{column: cell("refused", "the strategy's exchanges are not Horovod's allreduces: "
                        "the others would wait for the joined rank or average its zeros; "
                        "give every rank the same number of steps",
                        f"{KERAS}::test_join_is_refused_once_a_strategy_was_built")
           for column in ("topk", "dssync", "decentralized")},
    }),
]


KERAS_API = "tests/mpi/tensorflow_mixing/test_tf_keras_horovod_api.py"

RECIPES += [
    Recipe("Keras", "`backward_passes_per_step=N` (`average_aggregated_gradients`)", {
        "horovod": cell("works", "Horovod's own optimizer, bit for bit", f"{TF_DROPIN}::"
                        "test_keras_fit_twenty_steps_bitwise_identical_to_horovod"),
        "topk": cell("works", "TopK compresses the sum of the N passes", f"{TOPK_TF}::"
                     "test_training_reduces_the_loss_and_keeps_ranks_identical"),
        **{c: cell("changed", "the N passes' gradients are summed locally, then one local "
                   "step and one mix (parameters, not gradients, are averaged)",
                   f"{KERAS_API}::test_backward_passes_per_step_steps_and_mixes_once_every_"
                   "n_passes", f"{KERAS_API}::test_keras_fit_with_two_passes_per_step_"
                   "mixes_every_second_batch", f"{KERAS_API}::test_a_different_backward_"
                   "passes_per_step_on_one_rank_fails_on_every_rank")
           for c in ("dssync", "decentralized")},
    }),
    Recipe("Keras", "`optimizer.register_local_var(v)`", {
        **{c: cell("works", "`v` keeps its own gradient, divided by the number of ranks "
                   "(`scale_local_gradients`)", f"{TOPK_TF}::test_a_local_variable_keeps_its_own_gradient_divided_by_the_ranks")
           for c in ("horovod", "topk")},
        **{c: cell("works", "`v` and its optimizer slots are never mixed; register on "
                   "every rank before the first step, else refused",
                   f"{KERAS_API}::test_a_local_variable_and_its_momentum_stay_out_of_the_mix",
                   f"{KERAS_API}::test_registering_a_local_variable_after_the_first_step_"
                   "is_refused", f"{KERAS_API}::test_ranks_that_register_different_local_"
                   "variables_fail_on_every_rank")
           for c in ("dssync", "decentralized")},
    }),
    Recipe("Keras", "legacy optimizers (`tf.keras.optimizers.legacy`)", {
        "horovod": cell("works", "Horovod's own optimizer, bit for bit", f"{TF_DROPIN}::"
                        "test_keras_fit_with_a_legacy_optimizer_bitwise_identical_to_horovod"),
        "topk": cell("works", "", f"{TOPK_TF}::"
                     "test_legacy_keras_optimizers_run_topk_and_save_its_residuals"),
        "dssync": cell("works", "", f"{KERAS_API}::test_a_legacy_optimizer_saves_the_"
                       "mixing_state", f"{KERAS_API}::test_backward_passes_per_step_steps_"
                       "and_mixes_once_every_n_passes"),
        "decentralized": cell("works", "", f"{KERAS_API}::test_backward_passes_per_step_"
                              "steps_and_mixes_once_every_n_passes"),
    }),
]


def render() -> str:
    """The Markdown tables of ``docs/compatibility.md`` (one per framework); each cell's
    note is a numbered footnote under its table."""
    lines = []
    for framework in dict.fromkeys(r.framework for r in RECIPES):
        notes: Dict[str, int] = {}
        headings = columns()
        lines += [f"### {framework}", "",
                  "| recipe | " + " | ".join(headings.values()) + " |",
                  "|---|" + "---|" * len(headings)]
        for recipe in RECIPES:
            if recipe.framework != framework:
                continue
            cells = []
            for c in cells_of(recipe).values():
                mark = f" ({notes.setdefault(c.note, len(notes) + 1)})" if c.note else ""
                cells.append(c.verdict + mark)
            lines.append(f"| {recipe.name} | " + " | ".join(cells) + " |")
        lines.append("")
        lines += [f"{number}. {note}" for note, number in notes.items()]
        lines.append("")
    return "\n".join(lines)


PAGE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "compatibility.md"
BEGIN, END = "<!-- generated by tests/recipes.py: begin -->", \
    "<!-- generated by tests/recipes.py: end -->"


def page_with_tables(text: str) -> str:
    """``text`` with the part between :data:`BEGIN` and :data:`END` replaced."""
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n\n{render()}\n{END}{tail}"


if __name__ == "__main__":
    PAGE.write_text(page_with_tables(PAGE.read_text()))
    print(f"wrote {PAGE.relative_to(PAGE.parents[1])}", file=sys.stderr)
