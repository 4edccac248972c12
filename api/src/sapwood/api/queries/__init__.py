"""Read queries and writes behind the routes: plain functions of a connection, no HTTP in here."""
