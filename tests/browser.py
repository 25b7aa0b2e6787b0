"""The service's search page in a real headless browser: Debian's chromium and chromedriver,
driven through Selenium. tests/test_serve.py drives it; bench/figures.py takes the docs'
screenshot with the same code."""

from __future__ import annotations

import shutil

INSTALL = "apt-get install chromium chromium-driver (Debian's), then pip install -e '.[test]'"


def browser(width: int = 1280, height: int = 860):
    """A headless chromium; a machine without one fails here with how to install it."""
    chromium, driver = shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        raise RuntimeError(f"the search page is tested in a real browser, and this machine has no "
                           f"{'chromium' if chromium is None else 'chromedriver'}: {INSTALL}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(driver), options=options)


class SearchPage:
    """GET / of a running service, used as a person would: type, pick, click, read."""

    def __init__(self, driver, url: str, timeout: float = 120):
        from selenium.webdriver.support.ui import WebDriverWait

        self.driver, self.wait = driver, WebDriverWait(driver, timeout)
        driver.get(url.rstrip("/") + "/")

    def _find(self, selector: str):
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.CSS_SELECTOR, selector)

    def text(self, selector: str) -> str:
        return self._find(selector).text

    def auth_message(self) -> str:
        self.wait.until(lambda _: self._find("#auth").is_displayed() and self.text("#auth-message"))
        return self.text("#auth-message")

    def give_token(self, token: str) -> None:
        box = self._find("#token")
        box.clear()
        box.send_keys(token)
        self._find("#auth-form button").click()

    def about(self) -> str:
        """The header line (collection, size, width, model), once the page has loaded it."""
        self.wait.until(lambda _: "documents" in self.text("#about"))
        return self.text("#about")

    def _submit_and_read(self, click) -> list[dict[str, str]]:
        self.driver.execute_script("document.querySelector('#status').textContent = '';")
        click()
        self.wait.until(lambda _: self.text("#status") and self.text("#status") != "searching ...")
        if "error" in (self._find("#status").get_attribute("class") or ""):
            raise AssertionError(f"the page says: {self.text('#status')}")
        return self.hits()

    def search(self, query: str, k: int = 10, filter: str = "", mode: str | None = None) -> list[dict[str, str]]:
        from selenium.webdriver.support.ui import Select

        box = self._find("#query")
        box.clear()
        box.send_keys(query)
        Select(self._find("#k")).select_by_visible_text(str(k))
        self._find("#filter").clear()
        if filter:
            self._find("#filter").send_keys(filter)
        if mode is not None:
            Select(self._find("#mode")).select_by_value(mode)
        return self._submit_and_read(lambda: self._find("#search-form button[type=submit]").click())

    def refused(self, query: str, filter: str) -> str:
        """Search with a filter the service refuses: the page's red line (the old hits must be gone)."""
        box = self._find("#query")
        box.clear()
        box.send_keys(query)
        self._find("#filter").clear()
        self._find("#filter").send_keys(filter)
        self.driver.execute_script("document.querySelector('#status').textContent = '';")
        self._find("#search-form button[type=submit]").click()
        self.wait.until(lambda _: "error" in (self._find("#status").get_attribute("class") or ""))
        self._find("#filter").clear()
        return self.text("#status")

    def hits_shown(self) -> bool:
        return self._find("#hits").is_displayed()

    def status(self) -> str:
        return self.text("#status")

    def query(self) -> str:
        return self._find("#query").get_attribute("value")

    def modes(self) -> list[str]:
        from selenium.webdriver.common.by import By

        return [o.get_attribute("value") for o in self._find("#mode").find_elements(By.TAG_NAME, "option")]

    def more_like(self, rank: int) -> list[dict[str, str]]:
        """Click "more like this" on the hit at ``rank`` (1-based) and read the new hits."""
        from selenium.webdriver.common.by import By

        row = self._find("#rows").find_elements(By.TAG_NAME, "tr")[rank - 1]
        return self._submit_and_read(lambda: row.find_element(By.CSS_SELECTOR, "button.more").click())

    def hits(self) -> list[dict[str, str]]:
        """The hits table as the page shows it: one dict per row, by column heading."""
        from selenium.webdriver.common.by import By

        head = [th.text for th in self._find("#head").find_elements(By.TAG_NAME, "th")]
        return [dict(zip(head, (td.text for td in tr.find_elements(By.TAG_NAME, "td")), strict=False))
                for tr in self._find("#rows").find_elements(By.TAG_NAME, "tr")]

    def screenshot(self, path) -> None:
        self.driver.save_screenshot(str(path))
