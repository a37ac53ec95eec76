"""docs/design.md's complete example of a new mixing strategy is the code the tests run
(tests/mpi/ring_strategy.py, run by tests/mpi/torch_mixing/test_new_mixing_strategy.py
and tests/mpi/tensorflow_mixing/test_tf_new_mixing_strategy.py, with
tests/mpi/ring_catalogue.py)."""

import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_design_notes_example_strategy_is_the_tested_one():
    text = (ROOT / "docs" / "design.md").read_text()
    start = text.index("```python\n# hvdx/strategies/ring/spec.py") + len("```python\n")
    example = text[start:text.index("```", start)]
    module = (ROOT / "tests" / "mpi" / "ring_strategy.py").read_text()
    assert module.endswith(example)
    assert module.index("# hvdx/strategies/ring/spec.py") == len(module) - len(example)


def test_the_example_is_about_thirty_lines_of_code():
    module = (ROOT / "tests" / "mpi" / "ring_strategy.py").read_text()
    code = [line for line in module.split('"""')[-1].splitlines()
            if line.strip() and not line.lstrip().startswith("#")]
    assert len(code) <= 40, len(code)
