from lensemble.cli import main

main()
