"""Commands of `dreamgym` kept beside dreamgym/cli.py, which registers them: the data commands
(games, collect, validate, check-env) and the `buffer` and `stack` groups. Each is a thin
function over the library: parse options, resolve defaults from params, call, print."""
