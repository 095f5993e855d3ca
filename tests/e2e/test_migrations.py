from .console import console_env, manage

COUNT_FLEETS = "from fleets.models import Fleet; print(Fleet.objects.count())"


def test_F6_migrating_from_zero_creates_no_fleet(empty_database, tmp_path):
    env = console_env(tmp_path, DATABASE_URL=empty_database)
    migrated = manage("migrate", "--noinput", env=env)
    assert migrated.returncode == 0, migrated.stderr
    assert manage("shell", "--no-imports", "-c", COUNT_FLEETS, env=env).stdout.strip() == "0"
    checked = manage("check", env=env)
    assert checked.returncode == 0, checked.stderr
    assert manage("shell", "--no-imports", "-c", COUNT_FLEETS, env=env).stdout.strip() == "0"


def test_migrations_match_the_models(tmp_path):
    result = manage("makemigrations", "--check", "--dry-run", env=console_env(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
