"""The Python harness of the Linux guest tests (`just test-linux`,
`just test-mariadb`): one way to launch stagevm and read its serial console
(`vm`), one network namespace with a tap and a peer (`net`), the recorder of
checks (`checks`), and test-linux's boots and checks, one named function
each (`linux`, `console_boot`). images/linux/test.py and
images/linux/mariadb/test.py import it.
"""
