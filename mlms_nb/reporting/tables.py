"""The report's tables: the formatting lives in :mod:`mlms_nb.tables` (one place for text, HTML, notebooks and
reports); this module keeps the names the report's sections import."""
from mlms_nb.tables import (  # noqa: F401
    HEADERS, KEY_COLUMNS, MAX_CHARS, Column, Table, describe_column, format_frame, format_number, show_table,
    split_columns, table_html, table_text, width_of,
)
