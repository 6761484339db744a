"""Driver implementations for the optional client libraries (psycopg 3, SQLAlchemy, Django).

Each module imports its library at module level, so it is imported only when a caller's
connection of that library was given (:func:`api_sender.driver.async_driver_for`) or a
:class:`~api_sender.SyncSender` is opened: ``import api_sender`` never imports them.
"""
