"""The history store's schema migrations (Alembic), run at open by :func:`mlms_nb.store.migrate.upgrade`."""
