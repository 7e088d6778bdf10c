"""`python -m producer report`: a run's figures from its committed objects (figures.py), drawn as
pictures and one HTML page (render.py); parser.py and command.py are the command."""
