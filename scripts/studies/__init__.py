"""Run lists and drivers of single studies (LP vs CE, precision, headline runs, Song et al.'s synthetic
data, smoke runs). Imports only the installed core."""
