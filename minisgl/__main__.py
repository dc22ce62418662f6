from minisgl.cli import main

main()
