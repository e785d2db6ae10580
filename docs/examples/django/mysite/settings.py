from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "example-only"  # noqa: S105
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "pyharvest.django",  # app label "pyharvest": `migrate` creates the outbox table
    "shop",
]

DATABASES = {
    "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": BASE_DIR / "db.sqlite3"},
}

PYHARVEST_OUTBOX_TABLE = "outbox"  # the default

# manage.py reaper: reaper.yaml's sections and keys; dataSource comes from DATABASES.
PYHARVEST = {
    "harvest": {
        "baseKafkaConfig": {"bootstrap.servers": "localhost:9092"},
        "leaderGroupID": "shop",
    },
    "logging": {"level": "Info"},
}
