// Translation unit that carries the tests' precompiled header.
