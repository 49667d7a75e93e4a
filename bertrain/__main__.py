from bertrain.cli import entry

entry()
