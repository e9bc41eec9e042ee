"""Tests for bai/common/config.py (TOML files merged by precedence) and `bai config show` (written with tomli-w)."""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path

import pytest

from bai.common import config
from bai.common.config import DEFAULTS, ConfigError


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No BAI_CONFIG, XDG_CONFIG_HOME and the working directory inside tmp_path."""
    monkeypatch.delenv("BAI_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return tmp_path


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_bai_config_is_merged_over_defaults(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(isolated / "mine.toml", '[node]\nlisten = "0.0.0.0:9000"\n\n[agent.docker]\nnetwork = "bridge"\n')
    monkeypatch.setenv("BAI_CONFIG", str(path))
    cfg, used = config.load()
    assert used == [path]
    assert cfg["node"]["listen"] == "0.0.0.0:9000"
    # nested keys keep their siblings
    assert cfg["node"]["role"] == "all"
    assert cfg["node"]["backend"] == "auto"
    assert cfg["agent"]["docker"] == {"network": "bridge", "labels": {}, "user": "1000:1000", "cap_add": []}
    assert cfg["session"]["default_mem"] == "1g"
    assert cfg["images"] == DEFAULTS["images"]


def test_load_does_not_modify_defaults(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = copy.deepcopy(DEFAULTS)
    path = write(isolated / "mine.toml", '[agent.docker.labels]\nteam = "ml"\n')
    monkeypatch.setenv("BAI_CONFIG", str(path))
    cfg, _ = config.load({"agent": {"cpu": "4"}})
    cfg["node"]["role"] = "changed"
    assert DEFAULTS == before


def test_overrides_win_over_the_file(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(isolated / "mine.toml", '[node]\nlisten = "0.0.0.0:9000"\nrole = "manager"\n')
    monkeypatch.setenv("BAI_CONFIG", str(path))
    cfg, _ = config.load({"node": {"listen": "127.0.0.1:1234"}})
    assert cfg["node"]["listen"] == "127.0.0.1:1234"
    assert cfg["node"]["role"] == "manager"


def test_bai_config_replaces_the_search_list(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(Path.cwd() / "bai.toml", '[node]\nrole = "agent"\n')
    path = write(isolated / "mine.toml", '[node]\nlisten = "127.0.0.1:1"\n')
    monkeypatch.setenv("BAI_CONFIG", str(path))
    cfg, used = config.load()
    assert used == [path]
    assert cfg["node"]["role"] == "all"
    assert cfg["node"]["listen"] == "127.0.0.1:1"


def test_missing_bai_config_file_raises(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = isolated / "nope.toml"
    monkeypatch.setenv("BAI_CONFIG", str(missing))
    with pytest.raises(ConfigError, match="nope.toml"):
        config.load()


def test_broken_toml_names_the_file(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(isolated / "broken.toml", "[node\nlisten = \n")
    monkeypatch.setenv("BAI_CONFIG", str(path))
    with pytest.raises(ConfigError) as exc:
        config.load()
    assert str(path) in str(exc.value)


def test_broken_toml_in_cwd_names_the_file(isolated: Path) -> None:
    path = write(Path.cwd() / "bai.toml", "role = = 1\n")
    with pytest.raises(ConfigError) as exc:
        config.load()
    assert str(path) in str(exc.value)


def test_search_list_is_in_lookup_order(isolated: Path) -> None:
    assert config.config_files() == [
        Path.cwd() / "bai.toml",
        isolated / "xdg" / "bai" / "bai.toml",
        Path("/etc/bai/bai.toml"),
    ]


def test_the_first_file_found_wins_alone(isolated: Path) -> None:
    write(isolated / "xdg" / "bai" / "bai.toml", '[node]\nrole = "agent"\nlisten = "127.0.0.1:7000"\n')
    local = write(Path.cwd() / "bai.toml", '[node]\nrole = "manager"\n')
    cfg, used, sources = config.load_with_sources({"node": {"backend": "local"}})
    assert used == [local]
    assert cfg["node"]["role"] == "manager"
    assert cfg["node"]["listen"] == "127.0.0.1:8091"  # the user file is not read at all
    assert sources["node.role"] == str(local)
    assert sources["node.listen"] == "default"
    assert sources["node.backend"] == "command line"


def test_missing_files_are_skipped_without_bai_config(isolated: Path) -> None:
    cfg, used = config.load()
    assert not any(str(p).startswith(str(isolated)) for p in used)
    if not used:
        assert cfg == DEFAULTS


def test_user_file_alone(isolated: Path) -> None:
    user = write(isolated / "xdg" / "bai" / "bai.toml", '[images.aliases]\nr = "bai-r:4"\n')
    cfg, used = config.load()
    assert used == [user]
    assert cfg["images"]["aliases"] == {"python": "bai-python:3.11", "r": "bai-r:4"}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("127.0.0.1:8091", ("127.0.0.1", 8091)),
        ("0.0.0.0:80", ("0.0.0.0", 80)),
        (":8091", ("127.0.0.1", 8091)),
        ("localhost:65535", ("localhost", 65535)),
        ("[::1]:8091", ("::1", 8091)),
        ("example.com:0", ("example.com", 0)),
    ],
)
def test_parse_hostport_good(value: str, expected: tuple[str, int]) -> None:
    assert config.parse_hostport(value, "--listen") == expected


@pytest.mark.parametrize("value", ["8091", "host:", "host:port", "host:65536", "host:-1", "", "host:80x"])
def test_parse_hostport_bad(value: str) -> None:
    with pytest.raises(ConfigError) as exc:
        config.parse_hostport(value, "--listen")
    assert "--listen" in str(exc.value)
    assert repr(value) in str(exc.value)


def show(isolated: Path, monkeypatch: pytest.MonkeyPatch, text: str | None = None) -> str:
    """What `bai config show` prints, for a bai.toml in the working directory with `text` (none: defaults)."""
    from typer.testing import CliRunner

    from bai.cli.main import app

    if text is not None:
        write(Path.cwd() / "bai.toml", text)
    monkeypatch.setattr(config, "config_files", lambda: [Path.cwd() / "bai.toml"])
    result = CliRunner().invoke(app, ["config", "show"])
    assert result.exit_code == 0, result.output
    return result.output


def test_config_show_is_toml_of_the_defaults(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = show(isolated, monkeypatch)
    assert out.startswith("# node settings (read by `bai node` and `bai watcher`")
    assert "#   file: (none: defaults only)" in out
    assert tomllib.loads(out) == DEFAULTS  # the `# default` notes are TOML comments


def test_config_show_round_trips_a_file_and_masks_passwords(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (
        '[agent]\ncpu = "4"\n[agent.docker.labels]\n"com.example.team" = "ml"\n'
        '[images.registries.lab]\nurl = "r.example:5000"\nusername = "u"\npassword = "hunter2"\n'
        '[scaling_groups.default]\nallowed_networks = ["bridge", "host"]\n'
        '[vfolders.hosts]\nnfs = "/mnt/quote \\" backslash \\\\ tab \\t é"\n'
    )
    out = show(isolated, monkeypatch, text)
    assert "hunter2" not in out
    cfg, _ = config.load()
    cfg["images"]["registries"]["lab"]["password"] = "********"
    assert tomllib.loads(out) == cfg
    lines = out.splitlines()
    here = str(Path.cwd() / "bai.toml")

    def source(prefix: str) -> str:
        (line,) = [line for line in lines if line.startswith(prefix)]
        return line.rsplit("# ", 1)[1]

    assert source('cpu = "4"') == here
    assert source('"com.example.team" = "ml"') == here  # a quoted key is found among the sources
    assert source('password = "********"') == here
    assert source("allowed_networks = [") == here  # an array's source is on its first line
    assert source("allowed_session_types = [") == "default"
    assert source('role = "all"') == "default"
    assert '    "bridge",' in lines  # items of an array: one a line, no note


def test_credentials_round_trip_with_characters_toml_must_escape(tmp_path: Path) -> None:
    from bai.common import credentials

    creds = credentials.Credentials('http://h:1/"x"', "AK\\1", "sk\nwith \t tab")
    path = credentials.save(creds, tmp_path / "credentials.toml")
    assert (path.stat().st_mode & 0o777) == 0o600
    text = path.read_text()
    assert text.startswith("# written by `bai node`")
    assert tomllib.loads(text) == {
        "endpoint": creds.endpoint,
        "access_key": creds.access_key,
        "secret_key": creds.secret_key,
    }


def test_nothing_imports_tomli_or_the_old_writer() -> None:
    root = Path(__file__).resolve().parent.parent
    for path in [*(root / "bai").rglob("*.py"), *(root / "packaging").rglob("*.py")]:
        text = path.read_text()
        assert "import tomli\n" not in text and "from tomli " not in text and "tomlout" not in text, path


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[agent]\ncpus = 4\n", "[agent] cpus: unknown key (expected one of: app_start_timeout, cpu,"),
        ("[nodes]\nrole = 'all'\n", "nodes: unknown key (expected one of: agent,"),
        ("[link]\nheartbeat_interval = 'fast'\n", "[link] heartbeat_interval: expected a number, got 'fast'"),
        ("[agent]\npids_limit = 1.5\n", "[agent] pids_limit: expected a whole number, got 1.5"),
        ("[manager]\nhooks = 'mod'\n", "[manager] hooks: expected a list, got 'mod'"),
        ("[scaling_groups.gpu]\npolicy = 'fifo'\nselection = 'x'\n", "[scaling_groups.gpu] selection: unknown key"),
        ("[images]\naliases = { python = 3 }\n", "[images] aliases: expected a table of strings"),
        (
            "[images.registries.lab]\nurl = 'r.example:5000'\ntoken = 'x'\n",
            "[images.registries.lab] token: unknown key",
        ),
        ("[images.registries.lab]\nurl = 'r.example:5000'\ninsecure = 'yes'\n", "insecure: expected true or false"),
        ("[images.registries.lab]\nusername = 'u'\n", "[images.registries.lab] needs url"),
        ("[images]\nregistries = { lab = 'r.example' }\n", "expected tables [images.registries.NAME]"),
        ("[scaling_groups.gpu]\nallowed_networks = 'host'\n", "[scaling_groups.gpu] allowed_networks: expected a list"),
        ("node = 1\n", "node: expected a table, got 1"),
    ],
)
def test_a_bad_file_names_the_file_the_key_and_what_was_expected(
    isolated: Path, monkeypatch: pytest.MonkeyPatch, text: str, words: str
) -> None:
    path = write(isolated / "bad.toml", text)
    monkeypatch.setenv("BAI_CONFIG", str(path))
    with pytest.raises(ConfigError) as exc:
        config.load()
    assert str(exc.value).startswith(f"{path}: ") and words in str(exc.value)


def test_open_tables_and_scaling_groups_accept_their_own_names(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (
        '[images.aliases]\n"cr.backend.ai/stable/python" = "bai-python:3.11"\n'
        '[agent.docker.labels]\n"com.example.team" = "ml"\n'
        '[vfolders.hosts]\nnfs = "/mnt/nfs"\n'
        '[scaling_groups.gpu]\npolicy = "drf"\n'
    )
    monkeypatch.setenv("BAI_CONFIG", str(write(isolated / "ok.toml", text)))
    cfg, _ = config.load()
    assert cfg["scaling_groups"]["gpu"] == {"policy": "drf"}
    assert cfg["vfolders"]["hosts"] == {"nfs": "/mnt/nfs"}


def test_image_registries_and_allowed_networks(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert DEFAULTS["images"]["registries"] == {}  # no registry unless configured
    assert DEFAULTS["scaling_groups"]["default"]["allowed_networks"] == []
    assert DEFAULTS["scaling_groups"]["default"]["admin_allowed_networks"] == []
    text = (
        '[images.registries.lab]\nurl = "https://reg.example.com:5000"\nusername = "u"\npassword_file = "/etc/p"\n'
        '[images.registries.local]\nurl = "127.0.0.1:5000"\ninsecure = true\n'
        '[scaling_groups.default]\nallowed_networks = ["bridge"]\nadmin_allowed_networks = ["host"]\n'
    )
    monkeypatch.setenv("BAI_CONFIG", str(write(isolated / "ok.toml", text)))
    cfg, _ = config.load()
    assert cfg["images"]["registries"]["local"] == {"url": "127.0.0.1:5000", "insecure": True}
    assert cfg["images"]["aliases"] == DEFAULTS["images"]["aliases"]
    assert cfg["scaling_groups"]["default"]["allowed_networks"] == ["bridge"]
    assert cfg["scaling_groups"]["default"]["policy"] == "fifo"


def test_config_show_tells_the_clients_settings_from_the_nodes(
    isolated: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """On a client machine the file is the node's; the CLI's own endpoint and keypair come from elsewhere."""
    monkeypatch.delenv("BAI_STATE_DIR", raising=False)
    for key in ("BACKEND_ENDPOINT", "BACKEND_ACCESS_KEY", "BACKEND_SECRET_KEY"):
        monkeypatch.delenv(key, raising=False)
    out = show(isolated, monkeypatch, '[node]\nlisten = "0.0.0.0:9000"\n')
    assert f"#   file: {Path.cwd() / 'bai.toml'}" in out
    assert "#   none: no keypair in the environment (BACKEND_*) nor at" in out
    monkeypatch.setenv("BACKEND_ENDPOINT", "https://bai.example:8091")
    monkeypatch.setenv("BACKEND_ACCESS_KEY", "AKIACLIENT0000000000")
    monkeypatch.setenv("BACKEND_SECRET_KEY", "s" * 40)
    out = show(isolated, monkeypatch)
    assert "#   endpoint https://bai.example:8091, keypair AKIACLIENT0000000000" in out
    assert "#   from: environment (BACKEND_ACCESS_KEY / BACKEND_SECRET_KEY), environment (BACKEND_ENDPOINT)" in out
    assert tomllib.loads(out)["node"]["listen"] == "0.0.0.0:9000"


def test_a_node_of_another_state_dir_leaves_a_running_nodes_shared_keys_alone(
    isolated: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from bai.common import credentials
    from bai.common.credentials import Credentials

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.delenv("BAI_STATE_DIR", raising=False)
    one, two = tmp_path / "one", tmp_path / "two"
    first = Credentials("http://127.0.0.1:1", "AKIAONE0000000000000", "a" * 40)
    second = Credentials("http://127.0.0.1:2", "AKIATWO0000000000000", "b" * 40)
    own, shared = credentials.save_for_node(first, one, owner_runs=False)
    assert own == one / "credentials.toml" and shared == credentials.shared_path()  # free: taken
    own, shared = credentials.save_for_node(second, two, owner_runs=True)
    assert shared is None and credentials.load() == first  # the first node runs: its keys stay the default
    monkeypatch.setenv("BAI_STATE_DIR", str(two))
    assert credentials.load() == second and credentials.credentials_path() == two / "credentials.toml"
    monkeypatch.delenv("BAI_STATE_DIR")
    _, shared = credentials.save_for_node(second, two, owner_runs=False)  # the first stopped: taken over
    assert shared is not None and credentials.load() == second
    default = credentials.default_state_dir()
    _, shared = credentials.save_for_node(first, default, owner_runs=True)  # the default node always writes it
    assert shared is not None and credentials.load() == first
