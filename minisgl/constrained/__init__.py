"""Constrained decoding: grammars (JSON schema, regex, EBNF) that mask the tokens a request may sample
next, and the pieces of tool calling built on them. Backed by xgrammar, imported only when a request
carries a grammar (the import costs seconds)."""
