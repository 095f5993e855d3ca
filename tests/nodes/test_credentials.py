"""A cluster Fleet's credential may come only from a TUNEPLANE_TOKEN_* variable or a file in
TUNEPLANE_SECRETS_DIR (tuneplane/secret_sources.py).

An administrator edits the config that names both the credential and the URL it is sent to;
without these bounds, naming DATABASE_URL or the CA key would send the console's own secrets
to a server of their choosing. Refused when the config is saved (F4's field-named 400) and
again when it is read, for a Fleet saved before the rule.

A Kubernetes Fleet's requests go to REPLAYED API responses (tests/nodes/kube_replay.py: a
NodeList): what is proved is what the console reads and whether it sends anything, not how a
real API server answers.
"""

import os

import pytest

from fleets.choices import DEFAULT_DELIVERY, FleetKind
from fleets.models import Fleet
from nodes.backends.base import BackendError
from nodes.backends.slurm import SlurmBackend
from nodes.services.clusters import cluster_refresh

CONSOLE_SECRET = "postgres://console:database-password-not-for-clusters@db/tuneplane"
TOKEN_ENV = "TUNEPLANE_TOKEN_TEST_CREDENTIALS"


def kube_fleet(fleet_id: str, config: dict) -> Fleet:
    """Written past the API's check, as a Fleet saved before the names were confined."""
    return Fleet.objects.create(
        id=fleet_id,
        kind=FleetKind.KUBERNETES,
        config=config,
        delivery=DEFAULT_DELIVERY[FleetKind.KUBERNETES],
    )


def kube_config(url: str, **source) -> dict:
    return {"kube_api_url": url, "kuberay_namespace": "ml-jobs", **source}


@pytest.mark.parametrize(
    ("key", "name"),
    [
        ("kube_token_env", "DATABASE_URL"),
        ("kube_token_env", "TUNEPLANE_SECRET_KEY"),
        ("kube_token_env", "TUNEPLANE_TOKEN_"),
        ("slurm_token_env", "REDIS_URL"),
        ("slurm_token_env", "tuneplane_token_lowercase"),
    ],
)
def test_a_variable_outside_the_token_prefix_is_refused_on_save(admin_api, key, name):
    kind = "kubernetes" if key.startswith("kube") else "slurm"
    config = (
        kube_config("https://k8s:6443")
        if kind == "kubernetes"
        else {"slurm_rest_url": "http://127.0.0.1:6820", "slurm_user": "root"}
    )

    answer = admin_api.post(
        "/api/fleets", {"id": "cluster", "kind": kind, "config": {**config, key: name}}
    )

    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["field"] == f"config.{key}"
    assert "TUNEPLANE_TOKEN_" in error["message"]
    assert not Fleet.objects.exists()


def test_a_file_outside_the_secrets_dir_is_refused_on_save(admin_api, secrets_dir, console_pki):
    outside = [
        "/etc/passwd",
        str(console_pki / "ca.key"),
        f"{secrets_dir}/../pki/ca.key",
        str(secrets_dir),
        f"{secrets_dir}-sibling/token",
    ]
    for path in outside:
        answer = admin_api.post(
            "/api/fleets",
            {
                "id": "k8s",
                "kind": "kubernetes",
                "config": kube_config("https://k8s:6443", kube_token_file=path),
            },
        )
        assert answer.status_code == 400, path
        assert answer.json()["error"]["field"] == "config.kube_token_file"
        assert "TUNEPLANE_SECRETS_DIR" in answer.json()["error"]["message"]
    inside = admin_api.post(
        "/api/fleets",
        {
            "id": "k8s",
            "kind": "kubernetes",
            "config": kube_config("https://k8s:6443", kube_token_file=f"{secrets_dir}/k8s"),
        },
    )
    assert inside.status_code == 201


def test_the_pki_dir_is_refused_even_inside_the_secrets_dir(admin_api, settings, tmp_path):
    settings.TUNEPLANE_SECRETS_DIR = tmp_path
    settings.TUNEPLANE_PKI_DIR = tmp_path / "pki"

    answer = admin_api.post(
        "/api/fleets",
        {
            "id": "hpc",
            "kind": "slurm",
            "config": {
                "slurm_rest_url": "http://127.0.0.1:6820",
                "slurm_user": "root",
                "slurm_token_file": str(tmp_path / "pki" / "ca.key"),
            },
        },
    )

    assert answer.status_code == 400
    assert "PKI" in answer.json()["error"]["message"]


def test_a_fleet_saved_before_the_rule_reads_no_console_secret_and_sends_nothing(
    db, replay, monkeypatch
):
    monkeypatch.setenv("DATABASE_URL", CONSOLE_SECRET)
    fleet = kube_fleet("k8s-old", kube_config(replay.url, kube_token_env="DATABASE_URL"))

    snapshot = cluster_refresh(fleet)

    assert (
        "config.kube_token_env DATABASE_URL must be an environment variable named "
        "TUNEPLANE_TOKEN_" in snapshot.error
    )
    assert CONSOLE_SECRET not in snapshot.error
    assert replay.requests == []


def test_a_symlink_out_of_the_secrets_dir_is_not_followed(db, replay, secrets_dir, tmp_path):
    outside = tmp_path / "console.env"
    outside.write_text(CONSOLE_SECRET)
    fleet = kube_fleet(
        "k8s-link", kube_config(replay.url, kube_token_file=str(secrets_dir / "k8s-token"))
    )
    (secrets_dir / "k8s-token").symlink_to(outside)  # made after the config was saved

    snapshot = cluster_refresh(fleet)

    assert "leads out of TUNEPLANE_SECRETS_DIR" in snapshot.error
    assert CONSOLE_SECRET not in snapshot.error
    assert replay.requests == []


def test_issue17_item15_a_symlink_out_of_the_secrets_dir_is_refused_when_the_config_is_saved(
    admin_api, secrets_dir, tmp_path
):
    outside = tmp_path / "console.env"
    outside.write_text(CONSOLE_SECRET)
    (secrets_dir / "k8s-token").symlink_to(outside)
    config = {"kube_api_url": "https://k8s.internal:6443", "kuberay_namespace": "ml"}
    response = admin_api.post(
        "/api/fleets",
        {
            "id": "k8s-link",
            "kind": "kubernetes",
            "config": {**config, "kube_token_file": str(secrets_dir / "k8s-token")},
        },
    )
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["field"] == "config.kube_token_file"
    assert "leads out of TUNEPLANE_SECRETS_DIR" in error["message"]
    assert CONSOLE_SECRET not in response.content.decode()


def test_a_symlink_within_the_secrets_dir_is_read(db, replay, secrets_dir):
    # How a projected service-account token looks: token -> ..data/token.
    (secrets_dir / "..data").mkdir()
    (secrets_dir / "..data" / "token").write_text("projected-token\n")
    (secrets_dir / "token").symlink_to(secrets_dir / "..data" / "token")
    fleet = kube_fleet(
        "k8s-sa", kube_config(replay.url, kube_token_file=str(secrets_dir / "token"))
    )

    assert cluster_refresh(fleet).error == ""
    assert replay.requests[-1].headers["authorization"] == "Bearer projected-token"


def test_slurm_reads_its_jwt_through_the_same_rule(secrets_dir, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, "SLURM_JWT=eyJ.slurm.jwt\n")
    (secrets_dir / "slurm.jwt").write_text("SLURM_JWT=eyJ.from.file\n")
    config = {"slurm_rest_url": "http://127.0.0.1:9", "slurm_user": "root"}

    from_env = SlurmBackend.from_config({**config, "slurm_token_env": TOKEN_ENV})
    from_file = SlurmBackend.from_config(
        {**config, "slurm_token_file": str(secrets_dir / "slurm.jwt")}
    )
    refused = SlurmBackend.from_config({**config, "slurm_token_file": "/etc/hostname"})

    assert from_env._token() == "eyJ.slurm.jwt"
    assert from_file._token() == "eyJ.from.file"
    with pytest.raises(
        BackendError,
        match="config.slurm_token_file /etc/hostname must be a file in TUNEPLANE_SECRETS_DIR",
    ):
        refused._token()


def test_a_fifo_or_an_oversized_file_is_refused_not_waited_on(db, replay, secrets_dir):
    fifo, large = secrets_dir / "fifo", secrets_dir / "large"
    os.mkfifo(fifo)
    large.write_text("x" * (64 * 1024 + 1))
    for path, why in ((fifo, "not a regular file"), (large, "larger than 65536 bytes")):
        fleet = kube_fleet(f"k8s-{path.name}", kube_config(replay.url, kube_token_file=str(path)))
        assert why in cluster_refresh(fleet).error
    assert replay.requests == []


def test_a_nul_or_control_character_in_a_config_value_is_refused_on_save(admin_api, secrets_dir):
    for key, value in (
        ("kube_token_file", f"{secrets_dir}/token\x00"),
        ("kube_token_env", "TUNEPLANE_TOKEN_X\n"),
    ):
        answer = admin_api.post(
            "/api/fleets",
            {
                "id": "k8s",
                "kind": "kubernetes",
                "config": kube_config("https://k8s:6443", **{key: value}),
            },
        )
        assert answer.status_code == 400, key
        assert answer.json()["error"]["field"] == f"config.{key}"
