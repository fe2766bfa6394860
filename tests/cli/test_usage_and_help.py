"""What the CLI says before any work: usage errors as one `error:` line, and help text shown as written (rich reads
`[word ...]` as markup and drops it unless escaped)."""

import pytest
import typer
from rich.text import Text
from typer.testing import CliRunner

from perfmodel.cli.main import app

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args], prog_name="perfmodel")


def commands(command=None, path=("perfmodel",)):
    """(path, command) of the root and every group and command below it."""
    command = command or typer.main.get_command(app)
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from commands(sub, (*path, name))


@pytest.mark.parametrize("args,message", [
    (("hw", "show", "X", "--stor", "sqlite:///x"), "error: No such option: --stor"),
    (("predict", "resnet50", "--devices", "x"), "error: No such option: --devices"),
    (("nosuch",), "error: No such command 'nosuch' (see `perfmodel --help`)"),
    (("hw", "lst"), "error: No such command 'lst'. Did you mean 'list'? (see `perfmodel hw --help`)"),
    (("hw", "show"), "error: Missing argument 'name' (see `perfmodel hw show --help`)"),
    (("predict", "resnet18", "-b", "abc"), "error: Invalid value for '--batch-size' / '-b'"),
    (("--bogus",), "error: No such option: --bogus (see `perfmodel --help`)"),
])
def test_a_usage_error_is_one_error_line_and_exit_2(args, message):
    result = run(*args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), result.stderr
    assert result.stdout == ""


def test_a_group_without_its_command_still_shows_its_help():
    result = run("hw")
    assert result.exit_code == 2 and "bench" in result.output and "error:" not in result.output


def test_every_help_text_survives_rich_markup():
    """Every command's and option's help renders as written: a `[` that opens text rich would read as a markup
    tag is escaped (`\\[`)."""
    lost = []
    for path, command in commands():
        texts = [("help", command.help)] + [(param.name, getattr(param, "help", None)) for param in command.params]
        for where, text in texts:
            if text and Text.from_markup(text).plain != text.replace("\\[", "["):
                lost.append(f"{' '.join(path)} {where}: {text[:60]!r}")
    assert not lost, lost


def test_help_shows_brackets_as_written():
    result = run("export", "gavel", "--help")
    assert result.exit_code == 0
    assert '"(OTHER, SF)": [this, other]}}}' in " ".join(result.stdout.split())
    result = run("hw", "bench", "--help")
    assert "stored [bench-<device>]" in " ".join(result.stdout.replace("│", " ").split())


def test_a_group_help_that_lists_its_commands_lists_them_all():
    groups = {path[-1]: command for path, command in commands() if len(path) == 2 and hasattr(command, "commands")}
    for name in ("hw", "profiles", "models"):  # "...: list, show, ..."
        assert all(sub in groups[name].help for sub in groups[name].commands), (name, groups[name].help)


def test_the_gpu_accuracy_report_help_says_how_long_and_what_it_overwrites():
    help_text = " ".join(run("report", "gpu-accuracy", "--help").stdout.replace("│", " ").split())
    for fragment in ("1,986 runs", "about 16 minutes on a 2-core machine", "about 8 when --cache", "--graph-cache",
                     "Nothing runs on a GPU", "the default overwrites the committed report",
                     "[default: reports/gpu-accuracy]", "[env PERFMODEL_DATASETS_DIR, default shared/datasets"):
        assert fragment in help_text, fragment
