"""Database access: the SQL files, the named-query registry, connections and migrations."""
