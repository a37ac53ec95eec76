"""The measurement jobs' driver: a result printed before a teardown kill is kept, no
result is an error that shows what the job said."""

import sys

import pytest

from hvdx.bench.jobs import run_job

pytestmark = [pytest.mark.topk]


def _job(code: str):
    return [sys.executable, "-c", code]


def test_the_last_result_line_is_returned():
    row = run_job(_job('print("starting"); print(\'{"a": 1}\'); print(\'{"a": 2}\')'), "job")
    assert row == {"a": 2}


def test_a_result_followed_by_hydras_cleanup_kill_is_kept_and_said(capsys):
    # What Hydra does when one rank leaves without MPI_Finalize while another has not
    # yet exited: it kills the rest, and mpirun exits 9 with its banner on stdout.
    code = ('import sys; print(\'{"step_ms": 3.5}\'); '
            'print("=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES"); sys.exit(9)')
    row = run_job(_job(code), "process-set case 'x'")
    assert row == {"step_ms": 3.5}
    err = capsys.readouterr().err
    assert "process-set case 'x' exited with code 9 after rank 0 printed its result" in err
    assert "result kept" in err


def test_no_result_is_an_error_naming_the_job_with_both_outputs():
    code = ('import sys; print("BAD TERMINATION"); '
            'print("Traceback: boom", file=sys.stderr); sys.exit(9)')
    with pytest.raises(RuntimeError) as err:
        run_job(_job(code), "soak of topk")
    message = str(err.value)
    assert message.startswith("soak of topk failed (exit 9)")
    assert "Traceback: boom" in message and "BAD TERMINATION" in message


def test_a_clean_exit_without_a_result_is_an_error_too():
    with pytest.raises(RuntimeError, match=r"overlap measurement failed \(exit 0\)"):
        run_job(_job('print("no json here")'), "overlap measurement")
