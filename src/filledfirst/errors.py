class UserError(Exception):
    """Something the user can fix (config, input, environment); shown without a traceback."""
