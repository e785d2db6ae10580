from alembic import context
from sqlalchemy import engine_from_config, pool

from pyharvest.alembic import ignore_outbox_tables
from shop_schema import metadata  # the application's tables

config = context.config
options = {
    "target_metadata": metadata,
    # autogenerate must neither drop the outbox (it is not in `metadata`) nor compare it
    "include_name": ignore_outbox_tables("outbox"),
}

if context.is_offline_mode():  # alembic upgrade head --sql
    context.configure(url=config.get_main_option("sqlalchemy.url"), literal_binds=True, **options)
    with context.begin_transaction():
        context.run_migrations()
else:
    engine = engine_from_config(config.get_section(config.config_ini_section, {}), poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, **options)
        with context.begin_transaction():
            context.run_migrations()
