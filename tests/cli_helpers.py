"""What every command test asserts of an error: one line on stderr, no traceback."""


def one_line_error(capsys, *parts) -> str:
    """The one line a command printed on stderr, which holds each of ``parts``."""
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]
