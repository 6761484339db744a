"""config/example.env documents every setting, with its real default."""

from __future__ import annotations

from collections import Counter

from tests.deploy.files import CONFIG, SETTINGS_VARIABLES, example_env
from worker.settings import Settings

EXAMPLE = CONFIG / "example.env"


def test_example_env_names_exactly_the_settings() -> None:
    """Every Settings field appears once in example.env, and nothing else does."""
    names = [entry.name for entry in example_env()]
    duplicates = [name for name, count in Counter(names).items() if count > 1]
    assert not duplicates
    assert set(names) == SETTINGS_VARIABLES, (
        f"missing: {sorted(SETTINGS_VARIABLES - set(names))}, "
        f"unknown: {sorted(set(names) - SETTINGS_VARIABLES)}"
    )


def test_example_env_explains_each_variable_in_one_comment_line() -> None:
    """Each variable has exactly one comment line right above it."""
    for entry in example_env():
        assert entry.description, f"{entry.name} has no comment line above it"


def test_example_env_as_dotenv_gives_the_defaults() -> None:
    """Read as a .env file, example.env yields exactly the default settings."""
    documented = Settings(_env_file=EXAMPLE).model_dump()
    defaults = Settings(_env_file=None).model_dump()
    assert documented == defaults


def test_example_env_active_lines_are_defaults_and_unset_lines_have_no_default() -> None:
    """A variable set in example.env shows its default; a commented one defaults to unset."""
    for entry in example_env():
        field = Settings.model_fields[entry.name.lower()]
        if entry.commented:
            assert field.default is None, f"{entry.name} has a default: show it uncommented"
        else:
            value = getattr(
                Settings(_env_file=None, **{entry.name.lower(): entry.value}), entry.name.lower()
            )
            assert value == field.default, f"{entry.name}={entry.value} is not the default"


def test_example_env_commented_examples_are_valid() -> None:
    """The example values of the commented variables are accepted together."""
    examples = {e.name.lower(): e.value for e in example_env() if e.commented}
    settings = Settings(_env_file=None, usage_downstream="http", **examples)
    assert settings.database_url is not None
    assert settings.hub_url is not None
